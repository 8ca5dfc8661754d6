"""Problem 05's memory model and planning rule: pure functions, computed in the supervisor.

The card's memory model says how many bytes a device needs for one layout (dp, tp, pp) of a model
at a batch size, split as the card splits them (model state, activations); the rule picks, among the
legal layouts that fit, the least model parallelism and for it the widest TP. The checks compare
the learner's plan with best_plan, and the diagnoses run best_plan with the rule's usual
misreadings. No process is started here: tests/test_problem05.py unit-tests these functions and
pins the rule's answers on the named cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

GIB = 2**30
BYTES_PER_PARAM = 16  # fp16 weights 2 + fp16 grads 2 + fp32 master weights 4 + Adam m 4 + v 4
STATE_WITHOUT_OPTIMIZER = 4  # fp16 weights + fp16 grads: what is left if Adam's state is forgotten


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class Memory:
    """Bytes per device of one layout, exactly (Fractions), split as the card splits them."""

    state: Fraction  # weights, gradients and optimizer state
    activations: Fraction

    @property
    def total(self) -> Fraction:
        return self.state + self.activations


def memory_per_device(model: dict[str, Any], batch: int, dp: int, tp: int, pp: int,
                      bytes_per_param: int = BYTES_PER_PARAM) -> Memory:
    """The card's memory model: bytes_per_param * params / (tp * pp) of model state, plus
    (batch / dp) * seq_len * (layers / pp) * hidden * (10 + 24 / tp) bytes of activations."""
    state = Fraction(bytes_per_param * model["params"], tp * pp)
    per_token_layer = model["hidden"] * (10 + Fraction(24, tp))
    activations = Fraction(batch, dp) * model["seq_len"] * Fraction(model["layers"], pp) * per_token_layer
    return Memory(state, activations)


def layout_faults(model: dict[str, Any], devices: dict[str, int], batch: int,
                  layout: dict[str, int]) -> list[str]:
    """Why ``layout`` is not a legal layout at all (empty when it is)."""
    dp, tp, pp = layout["dp"], layout["tp"], layout["pp"]
    faults = []
    if min(dp, tp, pp) < 1:
        return [f"every degree must be at least 1, saw dp={dp}, tp={tp}, pp={pp}"]
    if dp * tp * pp != devices["count"]:
        faults.append(f"dp * tp * pp = {dp * tp * pp}, but there are {devices['count']} devices")
    if devices["per_node"] % tp:
        faults.append(f"tp = {tp} does not divide the {devices['per_node']} devices of a node "
                      "(a TP group must stay inside one node)")
    if model["layers"] % pp:
        faults.append(f"pp = {pp} does not divide the {model['layers']} layers")
    if batch % dp:
        faults.append(f"dp = {dp} does not divide the batch of {batch}")
    return faults


def best_plan(model: dict[str, Any], devices: dict[str, int], batch: int,
              bytes_per_param: int = BYTES_PER_PARAM, activations: bool = True,
              tp_first: bool = True) -> dict[str, int] | None:
    """The rule: the least model parallelism tp * pp that fits, and for it the widest tp.

    The keyword arguments give the rule's usual misreadings, for the diagnosis: another cost per
    parameter, no activations, PP before TP."""
    n = devices["count"]
    for mp in divisors(n):
        for tp in (reversed(divisors(mp)) if tp_first else divisors(mp)):
            layout = {"dp": n // mp, "tp": tp, "pp": mp // tp}
            if layout_faults(model, devices, batch, layout):
                continue
            if fits(model, devices, batch, layout, bytes_per_param, activations):
                return layout
    return None


def fits(model: dict[str, Any], devices: dict[str, int], batch: int, layout: dict[str, int],
         bytes_per_param: int = BYTES_PER_PARAM, activations: bool = True) -> bool:
    m = memory_per_device(model, batch, layout["dp"], layout["tp"], layout["pp"], bytes_per_param)
    return (m.total if activations else m.state) <= devices["memory_bytes"]
