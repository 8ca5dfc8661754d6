"""The side-channel key-value store of a task: ``comm.store()``, a ``torch.distributed.TCPStore``
that the supervisor hosts for the launch (runtime/supervisor/launch.py), for the heartbeats,
membership and coordinators that must not go through a collective that may hang.

``Store`` is the rank's handle, in the rank's agent (sealed, the learner reaches it through its
client: runtime/seal/store_client.py). It has TCPStore's calls (set, get, add, compare_set,
wait, delete_key, num_keys) on keys of the task alone (a prefix per task), and around each:

* counted in the rank's counters (``calls["store.get"]``, its value's bytes in ``op_bytes``);
* traced as a "store" event (runtime/trace/events.py), which costs nothing on the virtual clock;
* watched: a waiting get or wait shows in the rank's slot;
* faulted: a hung rank's call never returns, and a rank the fault plan cuts off the store (a
  partition that puts it on another side than rank 0, beside which the store lives, or a dead
  fault) waits its timeout and gets a ``CommTimeout``, as a real client on the far side would;
* a get or wait past its timeout raises ``distlab.CommTimeout`` naming the call, the key and the
  time waited, charged on the virtual clock as any call's timeout (runtime/comm/timed.py). The
  timeout is the call's ``timeout=``, else the store's (``set_timeout``), else the task
  communicator's (``comm.set_timeout``), else 300 s.

Keys are strings; values ``bytes`` or ``str`` (stored as UTF-8), as TCPStore takes them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Sequence

from ..trace.events import STORE
from .errors import timeout_seconds

if TYPE_CHECKING:
    from .proxy import Comm

DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class StoreLink:
    """Where a task's store is: the launch's TCPStore server and this task's key prefix."""

    host: str
    port: int
    prefix: str


def store_key(key: Any) -> str:
    if not isinstance(key, str) or not key or "\0" in key:
        raise TypeError(f"a store key is a non-empty str without NUL characters, not {key!r}")
    return key


def store_value(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"a store value is bytes or str, not {type(value).__name__}")


def _seconds(timeout: Any) -> float | None:
    return None if timeout is None else timeout_seconds(timeout, "store")


class Store:
    """The task's store as one rank's agent reaches it (see the module docstring)."""

    def __init__(self, link: StoreLink, comm: Comm) -> None:
        import torch.distributed as dist  # the store is torch's, whichever the engine

        self._tcp = dist.TCPStore(link.host, link.port, is_master=False,
                                  timeout=timedelta(seconds=DEFAULT_TIMEOUT_S))
        self._store = dist.PrefixStore(link.prefix, self._tcp)
        self._comm = comm  # the task's communicator: its counters, slot, trace, faults, step
        self._timeout_s: float | None = None  # set_timeout's

    # -- TCPStore's calls ------------------------------------------------------------------

    def set(self, key: str, value: Any) -> None:
        key, data = store_key(key), store_value(value)
        self._call("set", key, len(data), None,
                   lambda: self._store.set(key, data))  # type: ignore[arg-type]  # bytes too

    def get(self, key: str, timeout: Any = None) -> bytes:
        key = store_key(key)
        got: bytes = self._call("get", key, 0, _seconds(timeout), lambda: self._store.get(key))
        return got

    def add(self, key: str, amount: int) -> int:
        key = store_key(key)
        total: int = self._call("add", key, 8, None, lambda: self._store.add(key, int(amount)))
        return total

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        key, old, new = store_key(key), store_value(expected), store_value(desired)
        now: bytes = self._call("compare_set", key, len(new), None,
                                lambda: self._store.compare_set(key, old, new))  # type: ignore[arg-type]
        return now

    def wait(self, keys: Sequence[str], timeout: Any = None) -> None:
        names = [store_key(k) for k in keys]
        seconds = _seconds(timeout)
        limit = timedelta(seconds=self._waits(seconds))
        self._call("wait", ",".join(names), 0, seconds, lambda: self._store.wait(names, limit))

    def delete_key(self, key: str) -> bool:
        key = store_key(key)
        return bool(self._call("delete_key", key, 0, None, lambda: self._store.delete_key(key)))

    def num_keys(self) -> int:
        """Keys in the launch's store: this task's, and those of the tasks before it."""
        return int(self._call("num_keys", "", 0, None, self._store.num_keys))

    def set_timeout(self, timeout: Any) -> None:
        """The timeout of every later get and wait without a ``timeout=`` of its own."""
        self._timeout_s = timeout_seconds(timeout, "store")

    # -- around each call ------------------------------------------------------------------

    def _waits(self, timeout_s: float | None) -> float:
        """How long a get or wait may wait (see the module docstring)."""
        for seconds in (timeout_s, self._timeout_s, self._comm.get_timeout()):
            if seconds is not None:
                return seconds
        return DEFAULT_TIMEOUT_S

    def _call(self, op: str, key: str, nbytes: int, timeout_s: float | None, call: Any) -> Any:
        """Makes ``call`` (the store's own) as the module docstring says: counted and traced
        whether it succeeds or not (a get that timed out was still made)."""
        comm = self._comm
        comm._check_hung()
        waited = self._waits(timeout_s)
        name, blocking = f"store.{op}", op in ("get", "wait")
        wall0 = time.perf_counter()
        cut = comm._store_cut()
        if blocking:
            comm._slot.blocked(name, (), 0, comm._ctx)
            comm._slot.gives_up_at(time.monotonic() + waited)
        why, made = "", False
        try:
            if cut is not None:
                time.sleep(waited)  # the server never answers a client on the far side
                why = f"the store is out of reach ({cut})"
            else:
                if blocking:
                    self._store.set_timeout(timedelta(seconds=waited))
                try:
                    result = call()
                    made = True
                except RuntimeError as error:
                    if "timeout" not in str(error).lower():
                        raise
                    why = "no rank set it in time"
            if made and op in ("get", "compare_set"):
                nbytes = len(result)
        finally:
            if blocking:
                comm._slot.running()
            if not why:  # a call that gave up is counted with the others that did (timed.py)
                comm.stats.count_call(name, nbytes if made else 0)
            if comm._trace is not None:
                comm._trace.add((STORE, op, key, nbytes, wall0, time.perf_counter()))
        if why:
            raise comm._timed_out(name, key, waited, wall0, why)
        return result

    def close(self) -> None:
        del self._store, self._tcp


class StoreAccess:
    """Mixed into ``Comm`` (proxy.py): ``comm.store()``."""

    _book: Any
    _faults: Any

    @property
    def step(self) -> int:
        raise NotImplementedError

    def now(self) -> float:
        raise NotImplementedError

    def store(self) -> Store:
        """The task's key-value store (the same one on every communicator of the rank)."""
        book = self._book
        if book.store is None:
            if book.store_link is None:
                raise RuntimeError("comm.store(): this task has no store; a problem asks for one "
                                   "with Task(store=True)")
            book.store = Store(book.store_link, book.comms[0])
        return book.store  # type: ignore[no-any-return]

    def attach_store(self, link: StoreLink) -> None:
        """The harness's: gives the task the store at ``link`` (Task(store=True))."""
        self._book.store_link = link

    def release_store(self) -> None:
        """The harness's, at the task's end: closes the rank's client, if it made one."""
        if self._book.store is not None:
            self._book.store.close()
            self._book.store = None

    def _store_cut(self) -> str | None:
        """Why the fault plan keeps this rank from the store now, or None."""
        if self._faults is None:
            return None
        return self._faults.store_cut(self.step, self.now())  # type: ignore[no-any-return]
