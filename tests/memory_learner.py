"""The learner's file of tests/test_memory_probe.py: it holds memory in each of the places the
memory probe counts, a mark after each, and forges a reading the harness never asks for."""

import subprocess
import sys

import numpy as np

MIB = 1 << 20
STASH = np.ones(30 * MIB // 4, dtype=np.float32)  # 30 MiB, written (held) as the file is imported

# A process of its own, in a session of its own (detached from the learner), holding 40 MiB.
HOLDER = "import sys, time; held = b'x' * (40 << 20); print('ready', flush=True); time.sleep(120)"


def hold_everywhere(comm):
    comm.mark("start")
    grown = np.ones(20 * MIB // 4, dtype=np.float32)
    comm.mark("array")
    child = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, start_new_session=True)
    child.stdout.readline()
    comm.mark("child")
    with open("blob", "wb") as blob:  # in the learner's own folder: its /tmp, a tmpfs of its own
        blob.write(b"x" * (10 * MIB))
    comm.mark("file")
    return int(grown.nbytes + STASH.nbytes)


def hold_between_marks(comm):
    """30 MiB held for a while between two marks, and gone at each."""
    import time

    comm.mark("start")
    held = np.ones(30 * MIB // 4, dtype=np.float32)
    time.sleep(0.2)
    del held
    comm.mark("end")
    return 0


def just_mark(comm):
    comm.mark("start")
    return 1


def read_again(comm):
    """Sends the reading its harness sent before this file was imported: tampering."""
    from distlab.runtime.seal.calls import Call

    comm._end.call(Call.BEFORE_SOLUTION)
    comm.Barrier()
