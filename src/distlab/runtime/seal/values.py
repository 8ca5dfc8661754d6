"""What a task's result looks like on its way out of the learner process, and how the agent reads it.

The rank program runs in the learner process, so its return value (the evidence a check verifies)
comes from a process the learner controls. It travels as a pickle, because programs return
arrays, dataclasses and named tuples of their problem; but an ordinary ``pickle.loads`` runs any
callable the bytes name, which would hand the learner the agent (and, through the outcome file,
the supervisor). ``read_value`` therefore unpickles with ``find_class`` limited to a list:
containers and numbers of the standard library, NumPy's arrays, dtypes and scalars, CPU torch
tensors (their storage read by torch.load with weights_only=True: torch's own
``_load_from_bytes``, which a tensor's pickle names, is a whole unpickler), and the classes
defined in the problem's own package (written by the problem's author, not the learner), by their plain names:
neither its functions nor anything reached through a dotted name. Anything else is refused with
the name it asked for, which the verdict reports as tampering or as an unsupported value; so is a
value nested more than MAX_DEPTH deep, which the agent could not pickle into the rank's outcome.

A failure travels as JSON of four strings (kind, summary, where, traceback): text the learner
could forge, but only to fail its own check.
"""

from __future__ import annotations

import importlib
import io
import json
import pickle
from collections import deque
from typing import Any

# (module, name) pairs any value may use. NumPy 2 pickles under numpy._core, NumPy 1 under
# numpy.core: both are listed.
_SAFE: frozenset[tuple[str, str]] = frozenset(
    [("builtins", name) for name in ("complex", "set", "frozenset", "bytearray", "slice", "range",
                                      "int", "float", "str", "bytes", "list", "dict", "tuple",
                                      "bool", "object")]
    + [("collections", name) for name in ("OrderedDict", "deque", "defaultdict")]
    + [("copyreg", "_reconstructor")]
    + [(core, name) for core in ("numpy.core.multiarray", "numpy._core.multiarray")
       for name in ("_reconstruct", "scalar")]
    + [(numeric, "_frombuffer") for numeric in ("numpy.core.numeric", "numpy._core.numeric")]
    + [("numpy", "ndarray"), ("numpy", "dtype")]
    + [("torch._utils", "_rebuild_tensor_v2"), ("torch.storage", "_load_from_bytes"),
       ("torch", "Size"), ("torch", "float16"), ("torch", "float32"), ("torch", "float64"),
       ("torch", "bfloat16"), ("torch", "int64"), ("torch", "int32")]
)


class UnsafeValue(Exception):
    """The result asked for a class or function outside the list: ``name`` says which."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"the rank program's result names {name}, which the harness does not rebuild "
            "(only numbers, containers, NumPy arrays, CPU tensors and the problem's own classes)"
        )
        self.name = name


class NestedTooDeep(UnsafeValue):
    """The result nests containers deeper than ``MAX_DEPTH``."""

    def __init__(self) -> None:
        Exception.__init__(
            self, f"the rank program's result nests containers more than {MAX_DEPTH} deep, which the harness "
            "does not rebuild (no problem's value is; pickling or comparing one recurses past Python's limit)")
        self.name = f"containers nested more than {MAX_DEPTH} deep"


class IntTooLarge(UnsafeValue):
    """The result holds an int wider than ``MAX_INT_BITS``."""

    def __init__(self, bits: int) -> None:
        Exception.__init__(
            self, f"the rank program's result holds an int of {bits} bits, wider than the {MAX_INT_BITS} of any "
            "value the harness reads (checks print ints and make floats of them: Python prints none past 4300 "
            "digits, and makes no float past 1024 bits)")
        self.name = f"an int of {bits} bits"


# No program hands back an int wider than a 256-bit digest; checks print ints and turn them into
# floats, and an outside tester's 10**5000 (or 10**400) crashed seven problems' checks there.
MAX_INT_BITS = 512


# The unpickler builds nesting of any depth without recursing, but the agent then pickles the
# value into the rank's outcome, and checks compare and print it, all recursively: a result of
# 300,000 nested lists, forged into the channel, crashed its agent there ("exited with status 1
# before reporting") instead of being named.
MAX_DEPTH = 100
_LEAVES = frozenset({int, float, complex, bool, str, bytes, type(None)})  # the common ones, skipped at once
_CONTAINERS = (dict, list, tuple, set, frozenset, deque)


def _within_depth(value: Any) -> None:
    """Raises NestedTooDeep if ``value`` holds containers (or objects' attributes) more than
    MAX_DEPTH deep, IntTooLarge if it holds an int wider than MAX_INT_BITS; iterative, each object
    once (a pickle may make cycles)."""
    _narrow(value)
    stack, seen = [(value, 0)], set()
    while stack:
        item, depth = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            children: Any = (*item.keys(), *item.values())
        elif isinstance(item, _CONTAINERS):
            children = item
        else:
            children = getattr(item, "__dict__", None)
            if not isinstance(children, dict) or isinstance(item, type):
                continue
            children = children.values()
        for child in children:
            if type(child) in _LEAVES:
                _narrow(child)
                continue
            if isinstance(child, _CONTAINERS) or hasattr(child, "__dict__"):
                if depth + 1 > MAX_DEPTH:
                    raise NestedTooDeep()
                stack.append((child, depth + 1))


def _narrow(value: Any) -> None:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise IntTooLarge(value.bit_length())


# Listed callables that make something of a size their arguments say (bytearray(3 << 30), a list of
# a range, NumPy's empty array of a shape): a result of 48 bytes once took the agent to 12.6 GB.
# Here they make nothing larger than the pickle itself: a value's bytes travel in it.
_SIZED = frozenset({"bytearray", "bytes", "list", "set", "frozenset", "tuple", "dict", "deque",
                    "OrderedDict", "_reconstructor", "_reconstruct"})


class _ListedOnly(pickle.Unpickler):
    def __init__(self, data: bytes, packages: tuple[str, ...]) -> None:
        super().__init__(io.BytesIO(data))
        self._packages = packages
        self._limit = len(data) + 4096

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch.storage", "_load_from_bytes"):
            # torch's own is torch.load(..., weights_only=False): a whole unpickler. A tensor's
            # storage is read here with torch's restricted one instead.
            return _storage_weights_only
        if (module, name) in _SAFE and name in _SIZED:
            return _bounded(super().find_class(module, name), self._limit)
        if (module, name) in _SAFE:
            return super().find_class(module, name)
        # Otherwise a class, by its plain name, defined in the problem's package (its cases or its
        # programs, imported here if need be) or among NumPy's dtype classes. Never a dotted name
        # (pickle follows dots from attribute to attribute: "np.lib._npyio_impl.pickle.loads" from
        # a problem module that imports numpy is pickle.loads), never a function (it would be
        # called with the arguments the learner wrote), never another module the bytes name.
        own = any(module in (p, f"{p}.cases", f"{p}.programs") for p in self._packages)
        if not (own or module == "numpy.dtypes") or not name.isidentifier() or name.startswith("_"):
            raise UnsafeValue(f"{module}.{name}")
        found = getattr(importlib.import_module(module), name, None)
        if not isinstance(found, type) or found.__module__ != module:
            raise UnsafeValue(f"{module}.{name}")
        return found


def _bounded(make: Any, limit: int) -> Any:
    """``make``, refusing any argument that asks for more than ``limit`` items or bytes: an int,
    a sized argument (a range's length costs nothing to ask), or a shape's product."""

    shaped = getattr(make, "__name__", "") == "_reconstruct"  # NumPy's (class, shape, dtype)

    def made(*args: Any) -> Any:
        for arg in args:
            if shaped and type(arg) is tuple and all(type(d) is int for d in arg):
                asked = 1
                for d in arg:
                    asked *= max(d, 1)
            elif type(arg) is int:
                asked = arg
            elif type(arg) in (range, list, tuple, set, frozenset, dict, bytes, bytearray, str):
                asked = len(arg)
            else:
                continue
            if asked > limit:
                raise UnsafeValue(f"{getattr(make, '__name__', make)} of {asked} items from a pickle "
                                  f"of {limit - 4096} bytes")
        return make(*args)

    return made


def _storage_weights_only(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


def encode_value(value: Any) -> bytes:
    return pickle.dumps(value, protocol=5)


def read_value(data: bytes, packages: tuple[str, ...]) -> Any:
    """The value ``data`` holds, rebuilt from listed classes only (``UnsafeValue`` otherwise);
    ``packages``: the module names whose classes the problem's values may be (its package)."""
    try:
        value = _ListedOnly(data, packages).load()
    except UnsafeValue:
        raise
    except Exception as exc:  # a truncated or garbled pickle: the learner process wrote it
        raise UnsafeValue(f"a malformed pickle ({type(exc).__name__}: {exc})") from None
    _within_depth(value)
    return value


FAILURE_FIELDS = ("kind", "summary", "where", "traceback")


def encode_failure(kind: str, summary: str, where: str, traceback: str) -> bytes:
    return json.dumps(dict(zip(FAILURE_FIELDS, (kind, summary, where, traceback)))).encode()


def read_failure(data: bytes) -> dict[str, str]:
    """The four fields of a failure, each a string (anything else is the learner's forgery)."""
    try:
        fields = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise UnsafeValue("a failure report that is not JSON") from None
    if not isinstance(fields, dict) or any(not isinstance(fields.get(k), str) for k in FAILURE_FIELDS):
        raise UnsafeValue("a failure report without its four text fields")
    return {k: fields[k] for k in FAILURE_FIELDS}
