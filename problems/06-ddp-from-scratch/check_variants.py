"""Problem 06's hidden variants: the cases of the main launch and of the side-head launch.

Every number comes from the session seed, in a fixed order of draws, so ``--seed`` replays a
failure: layer widths, weight and data seeds, bucket caps (chosen strictly inside a range that
gives the wanted number of buckets), rank counts, learning rate, step count, and which steps skip
the side head. Each case's declared work per parameter is set so that backward compute is about
equal to its buckets' allreduce time on the platform.
"""

from __future__ import annotations

import numpy as np

from distlab.grading import CheckContext, check_part

training = check_part(__file__, "training")  # Case, layout: the model's parameters and sizes
costs = check_part(__file__, "costs")  # the bucket rule, cap picking, the ring's cost


def _widths(rng: np.random.Generator, depth: tuple[int, int] = (4, 7)) -> tuple[int, ...]:
    """A narrow input, ``depth`` (low, high inclusive) hidden layers of similar width, a narrow
    output."""
    hidden = [int(rng.integers(8, 13)) * 16 for _ in range(int(rng.integers(depth[0], depth[1] + 1)))]
    return (int(rng.integers(2, 5)) * 8, *hidden, int(rng.integers(1, 3)) * 8)


def _reverse_sizes(widths: tuple[int, ...], side_after: int | None = None) -> list[int]:
    case = training.Case("", 1, widths, 0, 0, 1, 0.0, 0.0, side_after)
    return [n for _, _, n in reversed(training.layout(case))]


def _timed(case: training.Case, t: CheckContext, alpha_beta: tuple[float, float],
           ratio: float) -> training.Case:
    """The case with forward work per parameter set so that backward work = ratio x the buckets'
    allreduce time alone."""
    sizes = _reverse_sizes(case.widths, case.side_after)
    comm_s = sum(costs.ring_time(case.p, sum(sizes[i] for i in b), *alpha_beta)
                 for b in costs.plan_buckets(sizes, case.cap_bytes))
    params = sum(n for _, n, _ in training.layout(case))
    return training.Case(case.label, case.p, case.widths, case.seed, case.cap_bytes, case.steps,
                         case.lr, ratio * comm_s / (2 * params), case.side_after, case.side_used)


def ring_alpha_beta(t: CheckContext, p: int) -> tuple[float, float]:
    routes = [t.platform.route(r, (r + 1) % p) for r in range(p)]
    return max(r.alpha_s for r in routes), max(r.beta_s_per_byte for r in routes)


def main_cases(t: CheckContext) -> list[training.Case]:
    """The cases of the main launch: the same for every check that reads it."""
    rng = np.random.default_rng([t.seed, 6])
    steps, lr = int(rng.integers(3, 6)), float(rng.choice([0.05, 0.08, 0.1]))

    def case(label: str, p: int, count: int | str) -> training.Case:
        widths = _widths(rng)
        sizes = _reverse_sizes(widths)
        if count == "below":  # a cap below the largest tensor: that tensor is a bucket alone
            cap = int(rng.integers(max(sizes) // 3, max(sizes) * 2 // 3))
        else:
            cap = costs.pick_cap(sizes, int(count), rng)
        plain = training.Case(label, p, widths, int(rng.integers(1 << 30)), cap, steps, lr, 0.0)
        return _timed(plain, t, ring_alpha_beta(t, p), float(rng.uniform(0.9, 1.1)))

    # Many layers of similar size and 6-8 buckets: the last bucket, which nothing can hide, is a
    # small part of the traffic.
    overlap_widths = _widths(rng, depth=(7, 9))
    overlap_sizes = _reverse_sizes(overlap_widths)
    count = int(rng.integers(6, 9))
    overlap = _timed(
        training.Case("the overlap case (p = 4)", 4, overlap_widths, int(rng.integers(1 << 30)),
                      costs.pick_cap(overlap_sizes, count, rng), steps, lr, 0.0),
        t, ring_alpha_beta(t, 4), float(rng.uniform(0.95, 1.05)))
    one = case("one bucket (p = 2)", 2, 1)
    p = int(rng.choice([2, 3]))
    two = case(f"two buckets (p = {p})", p, 2)
    p = int(rng.choice([3, 4]))
    many = case(f"a cap below the largest tensor (p = {p})", p, "below")
    return [one, two, many, overlap]


def side_case(t: CheckContext) -> training.Case:
    """A side head used in some steps only; its bucket holds other gradients too."""
    rng = np.random.default_rng([t.seed, 66])
    steps = int(rng.integers(3, 5))
    used = [bool(b) for b in rng.integers(0, 2, size=steps)]
    used[0], used[int(rng.integers(1, steps))] = True, False  # both kinds of step occur
    widths = _widths(rng)
    side_after = int(rng.integers(0, len(widths) - 2))
    sizes = _reverse_sizes(widths, side_after)
    side = [i for i, (name, _, _) in enumerate(reversed(training.layout(
                training.Case("", 1, widths, 0, 0, 1, 0, 0, side_after))))
            if name.startswith("side.")]
    for _ in range(100):
        cap = costs.pick_cap(sizes, int(rng.integers(2, 4)), rng)
        if all(len(b) > len(side) for b in costs.plan_buckets(sizes, cap) if set(side) & set(b)):
            break
    p = 2  # a launch of its own (a hang or an error ends it): kept small
    plain = training.Case(
        f"a side head skipped in steps {[s for s in range(steps) if not used[s]]} (p = {p})",
        p, widths, int(rng.integers(1 << 30)), cap, steps, 0.05, 0.0, side_after, tuple(used))
    return _timed(plain, t, ring_alpha_beta(t, p), 1.0)
