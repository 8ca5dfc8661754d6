"""The task's store as the learner's process sees it: ``comm.store()`` under the seal, with the
calls of ``torch.distributed.TCPStore`` (set, get, add, compare_set, wait, delete_key, num_keys,
set_timeout), each made by the rank's agent on the real store (runtime/comm/store.py), which
counts, traces and faults it. Keys and values are checked here as there, so a bad one gets the
same message; a value read back is at most MAX_STORE_VALUE bytes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..comm.errors import timeout_seconds
from ..comm.store import store_key, store_value
from .calls import KEY, MAX_STORE_VALUE, Call

if TYPE_CHECKING:
    from .client import SealedComm


def _timed(timeout: Any) -> tuple[int, float]:
    return (0, 0.0) if timeout is None else (1, timeout_seconds(timeout, "store"))


def _key(key: Any) -> str:
    key = store_key(key)
    if len(key.encode()) > KEY:
        raise ValueError(f"a store key is at most {KEY} bytes across the seal, not {len(key.encode())}")
    return key


class SealedStore:
    def __init__(self, comm: SealedComm) -> None:
        self._comm = comm

    def set(self, key: str, value: Any) -> None:
        data = np.frombuffer(store_value(value), dtype=np.uint8)
        self._comm._call(Call.STORE_SET, (_key(key),), (data,))

    def get(self, key: str, timeout: Any = None) -> bytes:
        return self._value(Call.STORE_GET, (*_timed(timeout), _key(key)))

    def add(self, key: str, amount: int) -> int:
        return int(self._comm._call(Call.STORE_ADD, (int(amount), _key(key))).ints[0])

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        parts = tuple(np.frombuffer(store_value(v), dtype=np.uint8) for v in (expected, desired))
        return self._value(Call.STORE_COMPARE_SET, (_key(key),), parts)

    def wait(self, keys: Sequence[str], timeout: Any = None) -> None:
        self._comm._call(Call.STORE_WAIT, (*_timed(timeout), "\0".join(_key(k) for k in keys)))

    def delete_key(self, key: str) -> bool:
        return bool(self._comm._call(Call.STORE_DELETE, (_key(key),)).ints[0])

    def num_keys(self) -> int:
        return int(self._comm._call(Call.STORE_NUM_KEYS).ints[0])

    def set_timeout(self, timeout: Any) -> None:
        self._comm._call(Call.STORE_TIMEOUT, (timeout_seconds(timeout, "store"),))

    def _value(self, op: int, args: tuple[Any, ...], inputs: tuple[np.ndarray, ...] = ()) -> bytes:
        place = np.empty(MAX_STORE_VALUE, dtype=np.uint8)
        reply = self._comm._call(op, args, inputs, (place,))
        return place[: reply.ints[0]].tobytes()
