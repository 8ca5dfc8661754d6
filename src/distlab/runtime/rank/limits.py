"""Resource limits for ranks running learner code, and how a breach is named."""

from __future__ import annotations

import resource
import signal
from types import FrameType

from ..jobspec import Limits


class CpuLimitExceeded(BaseException):
    """Raised in the rank when it used up its CPU-time allowance (SIGXCPU)."""


def apply(limits: Limits) -> None:
    """Sets soft limits; the hard CPU limit sits a little above so SIGXCPU arrives first."""
    mb = 1024 * 1024
    _lower(resource.RLIMIT_AS, limits.address_space_mb * mb)
    _lower(resource.RLIMIT_FSIZE, limits.file_size_mb * mb)
    _lower(resource.RLIMIT_CPU, limits.cpu_seconds, hard_extra=5)
    # A write past the file-size limit then fails with EFBIG instead of killing the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.signal(signal.SIGXCPU, _on_cpu_limit)


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
