"""Problem 06's judging: the expected weights, and the message that names what went wrong.

The expected final weights are single-process SGD on the global batch, computed here in the
supervisor (never on the ranks that run the learner's code). When a rank's weights differ,
diagnose_weights tells the known mistakes apart: no collective at all, initial weights never
broadcast, a bucket reduced twice, gradients summed instead of averaged; else it names the
parameter with the largest difference.
"""

from __future__ import annotations

import numpy as np

from distlab.grading import check_part

training = check_part(__file__, "training")  # the model, its layout, single-process SGD

RTOL, ATOL = 2e-4, 2e-5  # float32 SGD: summation order differs between p ranks and one process


def start_weights(case: training.Case) -> np.ndarray:
    return training.flat_weights(training.build_model(case, 0))


def close(got: np.ndarray, want: np.ndarray) -> bool:
    return got.shape == want.shape and bool(np.allclose(got, want, rtol=RTOL, atol=ATOL))


def worst_parameter(case: training.Case, got: np.ndarray, want: np.ndarray) -> str:
    """Names the parameter with the largest difference."""
    offset, worst, name_of = 0, -1.0, ""
    for name, n, _ in training.layout(case):
        diff = float(np.max(np.abs(got[offset:offset + n] - want[offset:offset + n]))) if n else 0.0
        if diff > worst:
            worst, name_of = diff, name
        offset += n
    return f"largest difference {worst:.3g} in {name_of}"


def diagnose_weights(case: training.Case, results: list[training.RankResult]) -> str | None:
    """None if every rank's final weights are single-process SGD's; else the symptom."""
    want = training.single_process(case)
    bad = [r for r, res in enumerate(results) if not close(res.final, want)]
    if not bad:
        return None
    rank = bad[0]
    head = f"{case.label}, after {case.steps} steps of SGD (lr {case.lr}): rank {rank}'s weights"
    if all(s.collectives == 0 for res in results for s in res.steps):
        return (f"{head} are not those of one process training on the global batch: no collective "
                "ran in any step, so each rank followed its own shard's gradients only")
    start = start_weights(case)
    diverged = [r for r, res in enumerate(results) if not np.array_equal(res.start, start)]
    if diverged:
        return (f"{head} are wrong: rank {diverged[0]} still held its own initial weights when "
                "DataParallel(...) returned; broadcast rank 0's weights to every rank first")
    got = results[rank].final
    total = sum(n for _, _, n in training.layout(case))
    for step, count in enumerate(results[rank].steps):
        if count.allreduce_bytes > total:
            return (f"{head} are wrong: its allreduces carried {count.allreduce_bytes} bytes in "
                    f"step {step}, more than the {total} bytes of gradients; a bucket reduced "
                    "twice comes out summed over the ranks twice")
    if case.p > 1 and close(got, training.single_process(case, lr_scale=case.p)):
        return (f"{head} moved {case.p} times too far each step: the gradients were summed over "
                f"the ranks, not averaged (divide by the world size, p = {case.p})")
    return f"{head} differ from single-process SGD on the global batch ({worst_parameter(case, got, want)})"
