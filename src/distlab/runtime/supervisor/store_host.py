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
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..jobspec import Job

HOST = "127.0.0.1"


@dataclass
class HostedStore:
    """The launch's store while it runs: its job (with ``store_address``) and the server, which
    the supervisor writes to itself (the deaths of a gloo job with survivors: deaths.py)."""

    job: Job
    server: Any = None  # a torch.distributed.TCPStore, or None for a launch without a store


@contextmanager
def hosted_store(job: Job) -> Iterator[HostedStore]:
    """The job, with ``store_address`` set while its store runs (unchanged without one)."""
    if not job.store:
        yield HostedStore(job)
        return
    import torch.distributed as dist  # only launches with a store pay for torch here

    server = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=30))
    hosted = HostedStore(dataclasses.replace(job, store_address=f"{HOST}:{server.port}"), server)
    try:
        yield hosted
    finally:
        hosted.server = None
        del server  # stops the server: no thread or port outlives the launch
