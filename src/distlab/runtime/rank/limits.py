"""Resource limits for ranks running learner code, and how a breach is named."""

from __future__ import annotations

import ctypes
import resource
import signal
from types import FrameType

from ..jobspec import Limits


class CpuLimitExceeded(BaseException):
    """Raised in the rank when it used up its CPU-time allowance (SIGXCPU)."""


def apply(limits: Limits, mapped_mb: int = 0) -> None:
    """Sets soft limits; the hard CPU limit sits a little above so SIGXCPU arrives first.
    ``mapped_mb``: address space the harness mapped into this process for itself (the seal's
    arena), which the limit leaves out, so that the code under it has the room it has unsealed."""
    mb = 1024 * 1024
    _cap_malloc_arenas()  # first: arenas made before it stay
    _lower(resource.RLIMIT_AS, (limits.address_space_mb + mapped_mb) * mb)
    _lower(resource.RLIMIT_FSIZE, limits.file_size_mb * mb)
    _lower(resource.RLIMIT_CPU, limits.cpu_seconds, hard_extra=5)
    # A write past the file-size limit then fails with EFBIG instead of killing the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.signal(signal.SIGXCPU, _on_cpu_limit)


# glibc's mallopt parameter for the number of malloc arenas (malloc.h); 2 is enough for a rank's
# main thread and the engine's few threads.
_M_ARENA_MAX = -8
MALLOC_ARENAS = 2


def _cap_malloc_arenas() -> None:
    """Caps glibc's malloc arenas, so that the address-space limit measures memory the rank uses.

    glibc gives each new thread that allocates an arena of its own, up to 8 per core, each a
    64 MiB reservation of address space: a gloo rank that makes a process group per call (two
    threads each) reached 1.86 GB of address space for 220 MB resident, and under the 1.5 GiB
    floor that a loaded machine gives twelve ranks (supervisor/memory.py) its next thread could
    not get a stack ("Resource temporarily unavailable" in ProcessGroupGloo). Capped, 1.0 GB.
    Elsewhere than glibc there is no mallopt, and nothing to cap."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except AttributeError:
        return
    mallopt(_M_ARENA_MAX, MALLOC_ARENAS)


def _on_cpu_limit(signum: int, frame: FrameType | None) -> None:
    raise CpuLimitExceeded()


def _lower(which: int, soft: int, hard_extra: int = 0) -> None:
    cur_soft, cur_hard = resource.getrlimit(which)
    hard = cur_hard if cur_hard == resource.RLIM_INFINITY else cur_hard
    want_hard = soft + hard_extra
    if hard != resource.RLIM_INFINITY and want_hard > hard:
        want_hard = hard
        soft = min(soft, hard)
    resource.setrlimit(which, (soft, want_hard))
