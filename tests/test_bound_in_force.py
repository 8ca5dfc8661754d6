"""Issue 11, item 4: a correct solution does not fail because the learner chose a platform or a
fault plan. On another platform than the card's, 03's time bound is the built-in ring replayed on
that platform (its shared links counted) when that is slower than the formula; under the
learner's own fault plan the time is reported, not graded. A slow ring still fails there."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli
from distlab.platforms import resolve, uniform
from distlab.runs import collective_time
from distlab.runtime.clock.collectives_cost import ring_allreduce_time
from e2e import fixture_solution

ALPHA, BETA = 3e-6, 1 / 10e9


@pytest.mark.parametrize("p, nbytes", [(2, 1 << 20), (4, 1 << 21), (7, 3 << 20)])
def test_on_a_star_the_replayed_ring_is_the_formula(p: int, nbytes: int) -> None:
    got = collective_time(uniform(p, ALPHA, BETA), "Allreduce", p, nbytes)
    assert got == pytest.approx(ring_allreduce_time(p, nbytes, ALPHA, BETA), rel=0.01)


@pytest.mark.parametrize("p", [7, 8])
def test_on_the_rack_shared_links_make_the_ring_slower_than_its_formula(p: int) -> None:
    # With 7 or 8 ranks, the rack's numbering makes the ring cross the socket link several
    # times each way: its steps share that link, which the per-route formula cannot see.
    rack, nbytes = resolve("rack"), 1 << 21
    routes = [rack.route(r, (r + 1) % p) for r in range(p)]
    formula = ring_allreduce_time(p, nbytes, max(r.alpha_s for r in routes),
                                  max(r.beta_s_per_byte for r in routes))
    assert collective_time(rack, "Allreduce", p, nbytes) > 1.5 * formula


def _flat(out: str) -> str:
    return " ".join(out.split())


# The bound under test is the supervisor's, the same sealed or not: these runs are unsealed, to
# spare the suite's time (the references sealed: tests/test_problemNN.py).
UNSEALED = ("--seal", "off")


def test_the_reference_passes_on_another_platform_and_a_slow_ring_still_fails() -> None:
    ok = run_cli("check", "03", "--solution", "reference", "--platform", "rack", "--seed", "11", *UNSEALED)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    slow = run_cli("check", "03", "--solution", str(fixture_solution("03", "alt_even_odd.py")),
                   "--platform", "rack", "--seed", "11", *UNSEALED)
    assert slow.returncode == 1
    assert "5% over the ring bound" in _flat(slow.stdout)


def test_under_the_learners_fault_plan_the_time_is_reported_not_graded(tmp_path: Path) -> None:
    plan = tmp_path / "delay.toml"
    plan.write_text('format_version = 1\nseed = 3\n\n[[fault]]\nkind = "delay"\nsrc = 1\n'
                    'latency_s = 0.001\n')
    ok = run_cli("check", "03", "--solution", "reference", "--faults", str(plan), "--seed", "11", *UNSEALED)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "reported, not graded" in _flat(ok.stdout)
    # So the run is practice, never progress: a plan that delayed nothing once turned a slow ring's
    # failed check of time into a pass that counted.
    assert "not recorded in your progress" in _flat(ok.stdout)
