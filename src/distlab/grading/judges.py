"""Judges several problems need: arrays that agree, with the first disagreement located.

    wrong = first_mismatch(got, want, rtol=1e-9, atol=1e-9)
    if wrong:
        t.fail(f"{case.label()}: rank {rank}, {wrong.describe()}")
    # "element 17: expected 3.0, saw 2.0 (5 of 64 elements wrong)"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


def agreement(got: Any, want: Any, *, rtol: float = 0.0, atol: float = 0.0) -> np.ndarray:
    """Element-wise agreement of two arrays: exact for integers (and where both tolerances are 0),
    ``np.isclose`` otherwise; all False when the shapes differ, or when ``got`` holds no numbers
    where ``want`` does (an outside tester's array of strings crashed np.isclose in a check)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or (want.dtype.kind in _NUMBERS and got.dtype.kind not in _NUMBERS):
        return np.zeros(want.shape, dtype=bool)
    exact = (rtol == 0 and atol == 0) or (want.dtype.kind in "iub" and got.dtype.kind in "iub")
    if exact:
        return np.asarray(got == want)
    return np.isclose(got, want, rtol=rtol, atol=atol)


_NUMBERS = "biufc"  # NumPy's kinds of numbers: bool, int, unsigned, float, complex


@dataclass(frozen=True)
class Mismatch:
    """Where two arrays first disagree."""

    index: int  # flat index of the first wrong element (-1: the shapes differ)
    expected: Any
    seen: Any
    wrong: int  # elements wrong
    total: int  # elements compared
    got_shape: tuple[int, ...] = ()
    want_shape: tuple[int, ...] = ()

    def describe(self, at: int | None = None) -> str:
        """'element 17: expected 3.0, saw 2.0 (5 of 64 elements wrong)'; ``at`` names the element
        by another index than its position (a sample of a larger array)."""
        if self.index < 0:
            return f"holds {self.got_shape} elements, expected {self.want_shape}"
        element = self.index if at is None else at
        return (f"element {element}: expected {self.expected!r}, saw {self.seen!r} "
                f"({self.wrong} of {self.total} elements wrong)")


def first_mismatch(got: Any, want: Any, *, rtol: float = 0.0, atol: float = 0.0) -> Mismatch | None:
    """None when ``got`` agrees with ``want`` everywhere (see ``agreement``), else the first
    element that does not, with how many do not."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return Mismatch(-1, None, None, want.size, want.size, got.shape, want.shape)
    ok = agreement(got, want, rtol=rtol, atol=atol).ravel()
    if ok.all():
        return None
    first = int(np.argmin(ok))
    return Mismatch(first, want.ravel()[first].item(), got.ravel()[first].item(),
                    int(ok.size - ok.sum()), int(ok.size))
