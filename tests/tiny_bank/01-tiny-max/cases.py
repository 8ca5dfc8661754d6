"""The cases: one value per rank; a Timed case is also read for its virtual time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Case:
    values: tuple[float, ...]

    @property
    def p(self) -> int:
        return len(self.values)

    def label(self) -> str:
        return f"p = {self.p}"


class Timed(Case):
    pass


def batch(rng: np.random.Generator, p: int) -> list[Case]:
    """Three cases on p ranks, the last one timed."""
    made = [tuple(float(v) for v in rng.integers(-100, 100, size=p)) for _ in range(3)]
    return [Case(made[0]), Case(made[1]), Timed(made[2])]
