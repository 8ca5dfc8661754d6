"""The memory a job's ranks may take, from what the machine has.

Each rank gets an address-space limit (rank/limits.py). A fixed 4 GiB per rank lets eight ranks
ask for 32 GiB on a 24 GiB machine, and the kernel's OOM killer, not the harness, then decides
which process dies. So the limit is the smaller of the job's own and an equal share of the
memory available when the job starts (never below a floor that lets Python, NumPy, torch and
MPI load: about 0.8 GiB of address space before any data).
"""

from __future__ import annotations

from dataclasses import replace

import psutil  # type: ignore[import-untyped]  # no stubs shipped

from ..jobspec import Limits

SHARE = 0.9  # of the available memory, for all ranks together
FLOOR_MB = 1536


def budget(limits: Limits, world_size: int, available_bytes: int | None = None) -> Limits:
    """``limits`` with the address space cut to this job's share of the machine."""
    if available_bytes is None:
        available_bytes = int(psutil.virtual_memory().available)
    share_mb = int(available_bytes * SHARE / max(world_size, 1) / (1 << 20))
    allowed = min(limits.address_space_mb, max(FLOOR_MB, share_mb))
    return limits if allowed == limits.address_space_mb else replace(limits, address_space_mb=allowed)
