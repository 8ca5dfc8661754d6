"""The key-value store of a launch whose tasks ask for one (``Task(store=True)``): a
``torch.distributed.TCPStore`` server in the supervisor, on a free port of the loopback, for as
long as the launch runs (every attempt of it: a restarted rank finds what the others wrote, as
with a job's real store). Ranks reach it from their agents (runtime/comm/store.py); the learner's
process cannot (it has no network under the seal).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from ..jobspec import Job

HOST = "127.0.0.1"


@contextmanager
def hosted_store(job: Job) -> Iterator[Job]:
    """The job, with ``store_address`` set while its store runs (unchanged without one)."""
    if not job.store:
        yield job
        return
    import torch.distributed as dist  # only launches with a store pay for torch here

    server = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=30))
    try:
        yield dataclasses.replace(job, store_address=f"{HOST}:{server.port}")
    finally:
        del server  # stops the server: no thread or port outlives the launch
