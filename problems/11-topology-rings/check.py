"""Checks for problem 11, topology-aware rings: the learner's ring and affinity on the card's
8-GPU server and on two hidden ones (ranks placed in another order, devices and switches renamed,
another socket link), each in one task: every rank's ring is read back, its bottleneck (hops that
share a link share its bandwidth) compared with the best of all 5040 rings computed here, an
allreduce along it timed on the virtual clock against the naive order, and each rank's CPU
affinity read from the kernel, not from the learner's code."""

from distlab import grading
from distlab.grading import CheckContext, Checklist, Run, Task

from .cases import CARD, NAIVE, Case, hidden_machine, numa_cpus
from .judging import (
    GBPS,
    crossings,
    not_a_ring,
    slow_ring,
    sum_problem,
    traffic_problem,
    wrong_pin,
)
from .programs import run_case

CHECKS = Checklist()
NBYTES = 12 << 20  # past the latency terms: the bottleneck decides


@CHECKS.run
def servers(t: CheckContext) -> Run:
    """One launch of 8 ranks: the card's server and two hidden ones, a task each; the allreduce
    is timed on the first two (0 bytes on the third: its ring is judged, not run)."""
    machines, widen = [CARD, hidden_machine(t.rng, "A"), hidden_machine(t.rng, "B")], grading.Widener(t.seed, 11)
    cases = [Case(m, numa_cpus(), NBYTES if i < 2 else 0, widen(int(t.rng.integers(1 << 31))))
             for i, m in enumerate(machines)]
    return t.launch(run_case, [Task(ranks=8, case=c, platform=c.machine.platform, label=c.label()) for c in cases])


@CHECKS.check("best_ring returns every rank once, the same ring on every rank", points=1)
def a_ring(t: CheckContext, servers: Run) -> None:
    for result in servers.cases():
        rings = [value["ring"] for value in result.values]
        for rank, ring in enumerate(rings):
            if wrong := not_a_ring(result.case, rank, ring):
                t.fail(wrong)
        t.expect(all(ring == rings[0] for ring in rings), "the same ring on every rank",
                 f"{result.case.label()}: rings {rings}")


@CHECKS.check("the ring's slowest hop is as fast as the best ring's", points=3)
def best_bottleneck(t: CheckContext, servers: Run) -> None:
    for result in servers.cases():
        machine, ring = result.case.machine, tuple(result.values[0]["ring"])
        if wrong := not_a_ring(result.case, 0, list(ring)):  # two ranks' "ring" shares no link
            t.fail(wrong)
        t.say(f"{machine.label()}: best ring {machine.best * GBPS:.0f} Gb/s; naive "
              f"{machine.bottleneck(NAIVE) * GBPS:.0f} Gb/s ({crossings(machine, NAIVE)} socket crossings); "
              f"yours {machine.bottleneck(ring) * GBPS:.0f} Gb/s ({crossings(machine, ring)})")
        if wrong := slow_ring(machine, ring):
            t.fail(wrong)


@CHECKS.check("allreduce along your ring at least 1.9x faster than the naive order", points=2)
def faster_than_naive(t: CheckContext, servers: Run) -> None:
    for result in (r for r in servers.cases() if r.case.nbytes):
        ring = result.values[0]["ring"]
        for problem in (not_a_ring(result.case, 0, ring), traffic_problem(result.case, ring, result.task.timeline().pair_bytes),
                        sum_problem(result.case, ring, [value["sum"] for value in result.values])):
            if problem:
                t.fail(problem)
        measured = t.measured_time(result.task)
        naive = grading.collective_time(result.task.platform, "Allreduce", 8, result.case.nbytes)
        t.say(f"{result.case.label()}: {measured * 1e3:.3f} ms along yours, {naive * 1e3:.3f} ms naive "
              f"({naive / measured:.2f}x)")
        t.metric(f"yours_ms {result.case.label()}", round(measured * 1e3, 4))
        t.metric(f"naive_ms {result.case.label()}", round(naive * 1e3, 4))
        if result.case.machine is CARD:
            t.performance(measured, naive / 1.9, result.task)
        t.expect(naive / measured >= 1.9, f"at most {naive / 1.9 * 1e3:.3f} ms (1.9x under the naive ring)",
                 f"{measured * 1e3:.3f} ms, {naive / measured:.2f}x faster than the naive ring")


@CHECKS.check("each rank runs on its GPU's socket's CPUs (read from the kernel)", points=2)
def pinned(t: CheckContext, servers: Run) -> None:
    for result in servers.cases():
        for rank in range(8):
            if wrong := wrong_pin(result.case, rank, result.task.cpus(rank)):
                t.fail(wrong)
    t.say(f"every rank on its socket's CPUs ({dict(numa_cpus())})")
