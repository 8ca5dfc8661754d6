"""Reduction operators that work the same on every engine.

Learner code passes an op to collectives and also applies it locally while reducing chunks by hand.
mpi4py's ``MPI.Op`` offers ``op.Reduce_local(inbuf, inoutbuf)`` for the second use, so ours do too:
code written as ``op.Reduce_local(received, mine)`` runs unchanged with ``MPI.SUM`` on a plain
``MPI.COMM_WORLD`` and with ``distlab.SUM`` under the harness.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class Op:
    """A commutative, associative reduction such as SUM or MAX."""

    name: str
    ufunc: Callable[..., Any]

    def Reduce_local(self, inbuf: Any, inoutbuf: Any) -> None:  # noqa: N802 (mpi4py's name)
        """inoutbuf = inbuf (op) inoutbuf, element-wise and in place."""
        target = as_numpy(inoutbuf)
        self.ufunc(as_numpy(inbuf), target, out=target)

    def __repr__(self) -> str:
        return self.name


SUM = Op("SUM", np.add)
PROD = Op("PROD", np.multiply)
MAX = Op("MAX", np.maximum)
MIN = Op("MIN", np.minimum)

BY_NAME: dict[str, Op] = {op.name: op for op in (SUM, PROD, MAX, MIN)}


def resolve(op: Any) -> Op:
    """Accepts our Op, an mpi4py MPI.Op (SUM, PROD, MAX, MIN) or a name; returns our Op."""
    if isinstance(op, Op):
        return op
    if isinstance(op, str) and op.upper() in BY_NAME:
        return BY_NAME[op.upper()]
    if type(op).__module__.startswith("mpi4py"):
        from mpi4py import MPI

        for ours in BY_NAME.values():
            if op == getattr(MPI, ours.name):
                return ours
    raise TypeError(f"unsupported reduction op {op!r}: use SUM, PROD, MAX or MIN")


def as_numpy(buf: Any) -> np.ndarray:
    """A NumPy view of a NumPy array or a CPU torch tensor (no copy; writes go through)."""
    if isinstance(buf, np.ndarray):
        return buf
    if type(buf).__module__.startswith("torch"):
        if buf.device.type != "cpu":
            raise TypeError(f"tensor on {buf.device}: this operation needs a CPU tensor")
        return buf.detach().numpy()
    raise TypeError(
        f"expected a NumPy array or a CPU torch tensor, got {type(buf).__name__}"
    )
