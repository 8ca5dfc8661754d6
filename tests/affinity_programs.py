"""Learner code that pins itself to one CPU and says it pinned to another (tests/test_affinity.py)."""

import os


def pin_and_lie(comm):
    mine = sorted(os.sched_getaffinity(0))[comm.rank % len(os.sched_getaffinity(0))]
    os.sched_setaffinity(0, {mine})
    return {"pinned": mine, "claims": [mine + 1]}
