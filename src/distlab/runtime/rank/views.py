"""What one rank may know of its task: the arguments as the problem's own classes cut them per rank.

A task's arguments (a problem's hidden cases) travel to every rank whole, in the job the rank's
agent reads. Handed whole to the rank program, they would give every learner process what only the
checker should hold: every rank's data, and with it the whole computation, which one process
could then do alone and return as its own, with no distribution at all (an outside tester passed
problem 16 by running the checker's replay in its learner process from the case it was handed).

So the rank (its agent, when sealed) hands the program ``value.for_rank(rank)`` wherever an
argument's class defines ``for_rank``: a problem's case keeps there only what the rank's own part
needs (its own data as arrays, the faults written into its own gradients; not a short key its data
is drawn from, which it could smuggle to the others inside a message of the right size), and the
checker keeps the whole case. The agent builds the view, so what it draws from never reaches the
learner's process. Lists and tuples are walked; anything else goes as it is. Unsealed, the same view is handed
over, so that a program sees the same arguments either way.
"""

from __future__ import annotations

from typing import Any


def for_rank(value: Any, rank: int) -> Any:
    """``value`` as rank ``rank`` may see it (see the module's docstring)."""
    cut = getattr(type(value), "for_rank", None)
    if callable(cut):
        return cut(value, rank)
    if type(value) in (list, tuple):
        return type(value)(for_rank(item, rank) for item in value)
    return value
