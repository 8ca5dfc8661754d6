"""A memory cgroup per learner: its processes bounded together, not only each alone.

The learner's address-space limit (RLIMIT_AS) binds each process it starts, and the process cap
their number (sandbox.py), so a learner that forks a hundred children under the limit each could
still take the machine's memory; the kernel would then kill learners first (their OOM score), but
only once the machine ran out. A memory cgroup bounds their sum, the pages they write into their
scratch folders (tmpfs) and into the seal's arenas included. Past it the kernel's OOM killer ends
one of the group's processes, and the group counts the kill (``oom_kills``), which names the cause.

The group is made inside the harness's own group (so a limit above it, a container's, still
binds), as root, in cgroup v1's memory hierarchy, or in cgroup v2 where the harness's group
already hands the memory controller to its children (v2 cannot start doing so in a group that has
processes). Elsewhere, without root, or in an unprivileged container, there is none
(``available`` says why) and each process stays bounded alone.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from . import sandbox

PREFIX = "distlab-learner-"


class MemoryGroup:
    def __init__(self, path: Path, v2: bool, limit_bytes: int) -> None:
        self.path = path
        self.v2 = v2
        self.limit_bytes = limit_bytes

    @classmethod
    def make(cls, name: str, limit_bytes: int) -> MemoryGroup | None:
        """A new group under the harness's own, named after its agent (``name``: its pid),
        bounded at ``limit_bytes``; None where no memory controller can be written."""
        found = _controller()
        if found is None:
            return None
        parent, v2 = found
        _sweep(parent)
        path = parent / f"{PREFIX}{name}"
        try:
            path.mkdir()
            (path / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(limit_bytes))
        except OSError:
            with contextlib.suppress(OSError):
                path.rmdir()
            return None
        return cls(path, v2, limit_bytes)

    def add(self, pid: int) -> None:
        """Moves process ``pid`` into the group; what it starts from then on is in it too."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def oom_kills(self) -> int:
        """How many of the group's processes the kernel's OOM killer ended (0 where the kernel
        does not count them)."""
        name = "memory.events" if self.v2 else "memory.oom_control"
        try:
            lines = (self.path / name).read_text().splitlines()
        except OSError:
            return 0
        return next((int(line.split()[1]) for line in lines if line.startswith("oom_kill ")), 0)

    def remove(self, wait_s: float = 2.0) -> None:
        """Removes the group once its processes are gone (a killed one leaves within moments)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return  # swept by the next group made here, once empty
                time.sleep(0.02)


def available() -> str:
    """Whether learners get a memory group here, in words for ``-v``: one is made and removed."""
    probe = MemoryGroup.make(f"{os.getpid()}-probe", 1 << 30)
    if probe is None:
        return ("no memory cgroup (not root, or no memory controller to write): each learner "
                "process is bounded alone")
    probe.remove()
    return (f"its processes' memory bounded together (a cgroup {'v2' if probe.v2 else 'v1'} "
            f"memory group each)")


def _controller() -> tuple[Path, bool] | None:
    """The harness's own memory group, where groups can be made in it: (its folder, v2)."""
    if os.geteuid() != 0:
        return None
    try:
        memberships = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in memberships:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            mount = _mount_point(mounts, "cgroup", "memory")
            if mount is not None and os.access(mount / path.lstrip("/"), os.W_OK):
                return mount / path.lstrip("/"), False
    for line in memberships:
        if line.startswith("0::"):
            mount = _mount_point(mounts, "cgroup2", None)
            if mount is None:
                return None
            own = mount / line[3:].lstrip("/")
            try:
                delegated = "memory" in (own / "cgroup.subtree_control").read_text().split()
            except OSError:
                return None
            return (own, True) if delegated and os.access(own, os.W_OK) else None
    return None


def _mount_point(mounts: list[str], fstype: str, option: str | None) -> Path | None:
    """Where a cgroup file system of ``fstype`` is mounted (with ``option`` among its super
    options, for v1's hierarchy of one controller)."""
    for line in mounts:
        fields = line.split()
        dash = fields.index("-")
        if fields[dash + 1] != fstype:
            continue
        if option is None or option in fields[dash + 3].split(","):
            return Path(fields[4])
    return None


def _sweep(parent: Path) -> None:
    """Removes the groups of agents that ended without removing theirs (killed outright): a group
    is named after its agent's pid, and one whose agent is gone and holds no process is stale."""
    with contextlib.suppress(OSError):
        for stale in parent.glob(f"{PREFIX}*"):
            agent = stale.name.removeprefix(PREFIX)
            if not agent.isdigit() or Path(f"/proc/{agent}").exists():
                continue
            with contextlib.suppress(OSError):
                if not (stale / "cgroup.procs").read_text().strip():
                    stale.rmdir()


def learner_memory_bytes(address_space_mb: int, first_arena_bytes: int, further_arenas_bytes: int) -> int:
    """What a learner's processes may hold together: one process's address space (what it may
    hold alone), its scratch folders full (sandbox.py) and the arenas' pages it may touch."""
    scratch_mb = sandbox.scratch_mb(address_space_mb) + 2 * sandbox.SMALL_SCRATCH_MB
    return ((address_space_mb + scratch_mb) << 20) + first_arena_bytes + further_arenas_bytes
