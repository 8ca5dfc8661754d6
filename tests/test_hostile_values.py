"""A value of a kind the rank program never returns fails its checks by name; none crashes.

The rank program runs in the solution's process, sealed too, so what it hands back is the
solution's to change. An outside tester made twelve problems' programs hand back such values
(tests/fixtures/hostile/NN/*.diff, each the reference with the program's function swapped): a
string where a record was due, an int of 5,000 digits, half a model, an array of strings, a list
as a dict key. Each crashed a check ("the check itself crashed"). Now each is refused where the
agent reads it (an int wider than 512 bits: runtime/seal/values.py) or named by the check.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FIXTURES
from e2e import apply_diff, assert_clean, reference_of, run_check

HOSTILE = FIXTURES / "hostile"
SEED = 5
WIDE_INT = "the solution tampered with its result: the rank program's result holds an int of"
# fixture -> what its run must say (None: it passes, its value being one the check may ignore)
SAID = {
    "01/huge": WIDE_INT,
    "02/fit": "measure came back with an alpha and a beta that are not two finite numbers",
    "02/str": "predict returned a str, expected a finite number of seconds",
    "03/objbuf": "handed back a buffer of <U1 where it hands back its buffer of numbers",
    "03/str": "handed back a str where it hands back its buffer of numbers",
    "05/huge": WIDE_INT,
    "07/unhash": None,  # its notes name a list as a dtype: ignored, the dtypes read off the sizes
    "08/hugekey": WIDE_INT,
    "09/huge": WIDE_INT,
    "10/shape": "the server returned an array of shape (3,) and float64, expected the final model",
    "13/str": "handed back a str, not its weights and optimizer state after training",
    "15/hugeloss": WIDE_INT,
    "15/placearr": "not its training's record",
    "16/str": "handed back a str, not its record of 24 steps",
}


def test_every_hostile_fixture_has_its_words() -> None:
    assert {f"{p.parent.name}/{p.stem}" for p in HOSTILE.glob("*/*.diff")} == set(SAID)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SAID))
def test_a_value_the_program_never_returns_fails_by_name_and_crashes_nothing(name: str, tmp_path: Path) -> None:
    problem = name[:2]
    diff = HOSTILE / f"{name}.diff"
    solution = tmp_path / f"{name[3:]}.py"
    solution.write_text(apply_diff(diff.read_text(), reference_of(problem).read_text(), str(diff)))
    run = run_check(problem, "--solution", str(solution), "--seal", "on", seed=SEED, timeout=150)
    assert_clean(run)
    assert run.results is not None, run.out
    assert "the check itself crashed" not in run.out, run.out
    if SAID[name] is None:
        return
    assert run.rc == 1, run.out
    assert SAID[name] in run.flat, run.out
