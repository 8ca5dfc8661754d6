"""A memory cgroup per learner (runtime/seal/memgroup.py), on this machine's real cgroup file system:
a group bounds the processes put in it together, counts the kernel's kills, and goes when asked."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from distlab.runtime.seal import memgroup

pytestmark = pytest.mark.skipif(memgroup.available().startswith("no "), reason=memgroup.available())

FILL = "import numpy as np, time; block = np.ones((200 << 20) // 8); print('filled', flush=True)"


def test_a_group_bounds_what_its_processes_hold_and_counts_the_kill() -> None:
    group = memgroup.MemoryGroup.make(f"{os.getpid()}-test", 64 << 20)
    assert group is not None and group.path.is_dir()
    try:
        child = subprocess.Popen([sys.executable, "-c", f"import os, sys; sys.stdin.read(1); {FILL}"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        group.add(child.pid)  # before it allocates: it waits for a byte
        out, _ = child.communicate("x", timeout=60)
        assert child.returncode == -9 and "filled" not in out, (child.returncode, out)
        assert group.oom_kills() == 1
    finally:
        group.remove()
    assert not group.path.exists()


def test_outside_a_group_the_same_process_fills_its_200_mib() -> None:
    done = subprocess.run([sys.executable, "-c", FILL], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "filled" in done.stdout


def test_a_group_an_ended_agent_left_behind_is_swept_by_the_next() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid names a group no agent holds any more
    stale = memgroup.MemoryGroup.make(str(dead.pid), 64 << 20)
    assert stale is not None
    fresh = memgroup.MemoryGroup.make(f"{os.getpid()}-sweeper", 64 << 20)
    assert fresh is not None
    try:
        assert not stale.path.exists() and fresh.path.exists()
    finally:
        fresh.remove()
        stale.remove()
