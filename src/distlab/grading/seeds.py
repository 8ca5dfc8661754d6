"""Case seeds too wide to search for.

A problem draws its hidden cases from the session's seed (63 bits wide), and with them each case's
own seed, from which the ranks' data follow, as ``rng.integers(1 << 31)``. A rank holds its own
data and can read cases.py: with 31 bits it can try every seed until one gives its data (an
outside tester's search in C ran 6 x 10^7 seeds a second per core and found problem 03's timed
cases' within the time limit), and then it holds every other rank's data too. ``Widener`` adds 32
bits to each such draw from a stream of the session's own, so the variants stay as drawn and the
data's seeds are 63 bits wide.
"""

from __future__ import annotations

import numpy as np


class Widener:
    """``widen(int(rng.integers(1 << 31)))``: the drawn seed with 32 more bits above it, from a
    stream of ``seed`` and ``key`` (the problem's own key, so that no two problems share it)."""

    def __init__(self, seed: int, *key: int) -> None:
        self._salt = np.random.default_rng([seed, *key, 0x5EED])

    def __call__(self, drawn: int) -> int:
        return drawn | (int(self._salt.integers(1 << 32)) << 31)
