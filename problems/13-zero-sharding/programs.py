"""What runs on the ranks of problem 13: the learner's sharded Adam training the MLP for real, the
data-parallel baseline whose traffic the byte check compares with, the memory calculator, and the
free run (main, bounds, figure). The ranks return plain data and judge nothing: what their
learner processes hold, their agents read (Task(memory=True)) at the program's marks."""

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from distlab import IN_PLACE, MAX, SUM

from . import cases
from .cases import Baseline, Memory, RankData, Training


@dataclass(frozen=True)
class Trained:
    """One rank's evidence after training: its weights, its batch losses, what ``state()`` returned,
    and every array reachable from its optimizer object (path -> a copy)."""

    weights: np.ndarray
    losses: tuple[float, ...]
    state: Any  # {"start": int, "m": array, "v": array}, or a sentence saying what went wrong
    reachable: dict[str, np.ndarray]


def reachable_arrays(root: Any, limit: int = 2000) -> dict[str, np.ndarray]:
    """Every NumPy array held by ``root``'s attributes, lists, tuples and dicts (the comm left out),
    by the path that reaches it: what the optimizer object keeps between steps."""
    found: dict[str, np.ndarray] = {}
    seen: set[int] = set()
    todo: list[tuple[str, Any]] = [("opt", root)]
    while todo and len(seen) < limit:
        path, obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type(None))):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            found[path] = np.array(obj, dtype=np.float64, copy=True) if obj.dtype.kind == "f" else np.zeros(0)
        elif isinstance(obj, dict):
            todo += [(f"{path}[{k!r}]", v) for k, v in obj.items()]
        elif isinstance(obj, (list, tuple)):
            todo += [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
        elif hasattr(obj, "__dict__") and not callable(getattr(obj, "Get_rank", None)):
            todo += [(f"{path}.{k}", v) for k, v in vars(obj).items()]
    return found


def read_state(opt: Any) -> Any:
    try:
        state = opt.state()
        return {"start": int(state["start"]), "m": np.array(state["m"], dtype=np.float64).ravel(),
                "v": np.array(state["v"], dtype=np.float64).ravel(),
                "nbytes": int(np.asarray(state["m"]).nbytes + np.asarray(state["v"]).nbytes)}
    except Exception as exc:  # noqa: BLE001 - any mistake becomes a message
        return f"opt.state() gave no {{'start', 'm', 'v'}} ({type(exc).__name__}: {exc})"


QUIET_S = 0.03  # the pause after each step, in which the agent samples what the optimizer keeps


def train(comm: Any, solution: Any, case: RankData) -> Trained:
    """Every rank starts from the same weights; each step's gradient is of the rank's own batch. The
    rank's agent reads what its learner process holds (Task(memory=True)): at the mark "footprint",
    the view's arrays there and the optimizer not yet, and after each step from the mark "rest" to
    the mark "kept", a pause in which no code of the learner's runs, sampled by the agent. The
    weights are trained where the view holds them: pages of its arrays given back to make room
    would read as zeros, and the weights are graded."""
    weights, losses = case.weights if case.weights.flags.writeable else case.weights.copy(), []
    comm.mark("footprint")
    opt = solution.ShardedAdam(comm, case.size, case.lr, (case.beta1, case.beta2), case.eps)
    for step in range(case.steps):
        loss, grad = cases.loss_and_gradient(case, weights, *case.batches[step])
        grad = grad.astype(np.float32)
        losses.append(loss)
        comm.compute(flops=6.0 * case.batch * case.size, label="forward+backward")
        opt.step(weights, grad)
        del grad  # the harness holds no gradient while the agent reads what the optimizer keeps
        comm.mark("rest")
        time.sleep(QUIET_S)
        comm.mark("kept")
    comm.mark("done")
    return Trained(np.array(weights, dtype=np.float32), tuple(losses), read_state(opt), reachable_arrays(opt))


def data_parallel(comm: Any, solution: Any, baseline: Baseline) -> None:
    # The baseline the byte check compares with: what plain data parallel moves every step, one
    # allreduce of the whole float32 gradient (the harness's code; the values do not matter here).
    case = baseline.training
    assert isinstance(case, RankData)
    grad = np.zeros(case.size, dtype=np.float32)
    for _ in range(case.steps):
        comm.mark("step")
        comm.Allreduce(IN_PLACE, grad, op=SUM)
    comm.mark("done")


def calculator(comm: Any, solution: Any, questions: list[Memory]) -> list[Any]:
    answers: list[Any] = []
    for q in questions:
        try:
            answers.append(float(solution.memory_per_rank_gb(q.params, q.ranks, q.stage)))
        except Exception as exc:  # noqa: BLE001
            answers.append(f"memory_per_rank_gb({q.params:g}, {q.ranks}, {q.stage}) raised {type(exc).__name__}: {exc}")
    return answers


def run_case(comm: Any, solution: Any, case: Any) -> Any:
    if isinstance(case, list):
        return calculator(comm, solution, case)
    return (data_parallel if isinstance(case, Baseline) else train)(comm, solution, case)


# -- the free run: distlab run 13, distlab tune 13 ----------------------------------------------------


def free_case(ranks: int, hidden: str, steps: str) -> Training:
    return Training(ranks, 24, int(hidden), 32, 0.01, 0.9, 0.999, 1e-8, 13, int(steps))


def main(comm, solution, hidden="200", steps="10", stage="2", params="7.5e9", gpus="64"):
    """Trains the MLP (24 inputs, ``hidden`` units) with your ShardedAdam on every rank, then asks your
    calculator about ``params`` parameters on ``gpus`` ranks at ``stage``. Rank 0 returns the loss
    before and after, the share of the moments each rank holds (1/p when sharded), and the
    calculator's GB per rank, which the Tune step sweeps:

        distlab tune 13 --param stage=0,1,2,3 --metric gb_per_rank
        distlab tune 13 --param gpus=1,4,16,64,256,1024 --fixed stage=2 --metric gb_per_rank"""
    case, rank = free_case(comm.Get_size(), hidden, steps), comm.Get_rank()
    trained = train(comm, solution, case.for_rank(rank))
    held = np.array([trained.state["m"].size if isinstance(trained.state, dict) else 0], dtype=np.float64)
    comm.Allreduce(IN_PLACE, held, op=MAX)  # the most moments any rank holds
    rank0 = trained.weights.copy()
    comm.Bcast(rank0, root=0)
    drift = np.array([float(np.max(np.abs(trained.weights - rank0)))])
    comm.Allreduce(IN_PLACE, drift, op=MAX)  # how far any replica is from rank 0's
    if rank != 0:
        return None
    gb = float(solution.memory_per_rank_gb(float(params), int(gpus), int(stage)))
    return {"model": f"{case.size} parameters on {case.p} ranks", "ok": bool(drift[0] == 0.0),
            "replicas": "the same" if drift[0] == 0.0 else f"DIFFER by up to {drift[0]:.3g}",
            "loss_before": round(trained.losses[0], 5), "loss_after": round(cases.held_out_loss(case, trained.weights), 5),
            "moments_share": round(float(held[0]) / case.size, 4), "stage": int(stage), "params": float(params),
            "gpus": int(gpus), "gb_per_rank": round(gb, 4)}


def bounds(platform, ranks, hidden="200", steps="10", stage="2", params="7.5e9", gpus="64"):
    """The paper's closed form for the calculator's question, and 1/p for the moments (the dashed line)."""
    from .judging import (
        zero_gb,  # the checker's: never imported where the learner's code runs
    )

    return {"gb_per_rank": zero_gb(float(params), int(gpus), int(stage)), "moments_share": 1 / ranks}


def figure(summary: dict) -> str:
    """Bars of GB per rank at stages 0-3 for the free run's model and rank count (the paper's closed
    forms, computed here), split into weights, gradients and optimizer states."""
    try:
        params, gpus = float(summary["params"]), int(summary["gpus"])
    except (KeyError, TypeError, ValueError):
        return ""
    from .judging import figure_svg

    return figure_svg(params, gpus, summary.get("gb_per_rank"), summary.get("stage"))
