"""The agent's side of the task's store across the seal: each store request of the learner made
on the rank's ``Store`` (runtime/comm/store.py), which counts, traces and faults it. A value comes
back through an output place of at most MAX_STORE_VALUE bytes (runtime/seal/calls.py)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..comm.proxy import Comm
from .agent import Request
from .calls import MAX_STORE_VALUE, Call
from .lines import Switch

Handler = Callable[[Comm, Request], None]


def store_handlers(agent: Switch) -> dict[int, Handler]:
    def timeout(request: Request) -> float | None:
        return request.floats[0] if request.ints[0] else None

    def value(request: Request, data: bytes) -> None:
        if len(data) > MAX_STORE_VALUE:
            raise ValueError(f"{request.name}: the value of {request.text!r} is {len(data)} bytes; "
                             f"across the seal a value is at most {MAX_STORE_VALUE}")
        agent.reply(request, ints=(len(data),), outputs=(np.frombuffer(data, dtype=np.uint8),))

    def set_(comm: Comm, request: Request) -> None:
        comm.store().set(request.text, request.inputs[0].tobytes())
        agent.reply(request)

    def get(comm: Comm, request: Request) -> None:
        value(request, comm.store().get(request.text, timeout(request)))

    def add(comm: Comm, request: Request) -> None:
        agent.reply(request, ints=(comm.store().add(request.text, request.ints[0]),))

    def compare_set(comm: Comm, request: Request) -> None:
        expected, desired = (part.tobytes() for part in request.inputs)
        value(request, comm.store().compare_set(request.text, expected, desired))

    def wait(comm: Comm, request: Request) -> None:
        comm.store().wait(request.text.split("\0"), timeout(request))
        agent.reply(request)

    def delete_key(comm: Comm, request: Request) -> None:
        agent.reply(request, ints=(int(comm.store().delete_key(request.text)),))

    def num_keys(comm: Comm, request: Request) -> None:
        agent.reply(request, ints=(comm.store().num_keys(),))

    def set_timeout(comm: Comm, request: Request) -> None:
        comm.store().set_timeout(request.floats[0])
        agent.reply(request)

    return {Call.STORE_SET: set_, Call.STORE_GET: get, Call.STORE_ADD: add,
            Call.STORE_COMPARE_SET: compare_set, Call.STORE_WAIT: wait,
            Call.STORE_DELETE: delete_key, Call.STORE_NUM_KEYS: num_keys,
            Call.STORE_TIMEOUT: set_timeout}
