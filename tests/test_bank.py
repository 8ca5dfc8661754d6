"""Cards and the index: the shipped bank validates, and every malformed card names its fault."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from distlab.bank import Bank, load_card, resolve_solution
from distlab.errors import CardError, UsageError

from conftest import PROBLEMS

CARD_03 = PROBLEMS / "03-ring-allreduce" / "card.toml"


def test_the_index_holds_25_problems_in_three_tiers_3_5_2() -> None:
    bank = Bank(PROBLEMS)
    assert [e.number for e in bank.entries] == [f"{i:02d}" for i in range(1, 26)]
    tiers = [e.tier for e in bank.entries]
    assert (tiers.count("basic"), tiers.count("advanced"), tiers.count("expert")) == (8, 12, 5)


def test_every_written_problem_has_its_files_and_a_valid_card() -> None:
    for entry in Bank(PROBLEMS).entries:
        if not entry.ready:
            continue
        for name in ("starter.py", "reference.py", "check.py"):
            assert (entry.path / name).is_file(), f"{entry.path}/{name}"
        card = entry.card()
        assert card.id == entry.number and card.slug == entry.slug
        assert len(card.hints) >= 3


def test_problems_are_found_by_number_or_slug() -> None:
    bank = Bank(PROBLEMS)
    assert bank.problem("3").slug == "ring-allreduce"
    assert bank.problem("ring-allreduce").number == "03"
    with pytest.raises(UsageError, match="no problem '99'"):
        bank.problem("99")


def test_a_coming_problem_is_refused_with_a_sentence() -> None:
    bank = Bank(PROBLEMS)
    coming = next(e for e in bank.entries if not e.ready)
    with pytest.raises(UsageError, match="coming but not written yet"):
        bank.ready_problem(coming.number)


def _card_with(tmp_path: Path, old: str, new: str) -> Path:
    text = CARD_03.read_text()
    assert old in text
    path = tmp_path / "card.toml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize(
    "old, new, message",
    [
        ('tier = "basic"', 'tier = "easy"', "key 'tier' must be one of basic, advanced, expert; got 'easy'"),
        ('time_limit_s = 60', 'time_limit_s = "soon"', "key 'time_limit_s' must be an integer"),
        ('world_sizes = [1, 2, 3, 4, 5, 8]', 'world_sizes = [1, 0]', "key 'world_sizes' entries must be integers >= 1"),
        ('backends = ["mpi", "gloo"]', 'backends = ["nccl2"]', "key 'backends' entries must be among mpi, gloo"),
        ('format_version = 1', 'format_version = 7', "key 'format_version' is 7"),
        ('id = "03"', 'id = "3"', "key 'id' must be two digits"),
        ('title = "AllReduce by hand over MPI"', 'titel = "x"', "key 'titel' is not a known key"),
        ('title = "AllReduce by hand over MPI"\n', '', "key 'title' is missing"),
        ('[steps]', '[steps]\nrelax = "x"', "key 'steps.relax' is not a known key"),
        ('[scenario]', '[scenario]\nbackground2 = "x"', "key 'scenario.background2' is not a known key"),
        ('tier = "basic"', 'tier = basic', "not valid TOML"),
        ('time_limit_s = 60', 'time_limit_s = 60\nfree_run_ranks = 0', "key 'free_run_ranks' must be an integer >= 1"),
        # The learner's file lives in the workspace: a card may not send it anywhere else.
        ('solution_file = "03-ring-allreduce.py"', 'solution_file = "../03.py"',
         "key 'solution_file' must be a file name inside the workspace; got '../03.py'"),
        ('solution_file = "03-ring-allreduce.py"', 'solution_file = "/tmp/03.py"',
         "key 'solution_file' must be a file name inside the workspace; got '/tmp/03.py'"),
        ('solution_file = "03-ring-allreduce.py"', 'solution_file = "sub/../../03.py"',
         "key 'solution_file' must be a file name inside the workspace"),
    ],
)
def test_a_malformed_card_names_the_key_and_the_value(tmp_path: Path, old: str, new: str, message: str) -> None:
    with pytest.raises(CardError) as info:
        load_card(_card_with(tmp_path, old, new))
    assert message in str(info.value)
    assert str(tmp_path / "card.toml") in str(info.value)


def test_a_card_without_hints_is_rejected(tmp_path: Path) -> None:
    text = CARD_03.read_text()
    start = text.index("hints = [")
    end = text.index("]\n", start) + 2
    path = tmp_path / "card.toml"
    path.write_text(text[:start] + "hints = []\n" + text[end:])
    with pytest.raises(CardError, match="key 'hints' must be a list of at least 1"):
        load_card(path)


def test_a_broken_index_is_reported(tmp_path: Path) -> None:
    shutil.copy(PROBLEMS / "index.toml", tmp_path / "index.toml")
    text = (tmp_path / "index.toml").read_text().replace('number = "02"', 'number = "01"')
    (tmp_path / "index.toml").write_text(text)
    with pytest.raises(CardError, match="problem number 01 appears twice"):
        Bank(tmp_path)


def test_solutions_resolve_to_the_problem_files_or_a_path(tmp_path: Path) -> None:
    entry = Bank(PROBLEMS).problem("03")
    assert resolve_solution(entry, "reference") == entry.path / "reference.py"
    assert resolve_solution(entry, "starter") == entry.path / "starter.py"
    mine = tmp_path / "mine.py"
    mine.write_text("")
    assert resolve_solution(entry, str(mine)) == mine
    with pytest.raises(UsageError, match="does not exist"):
        resolve_solution(entry, str(tmp_path / "nope.py"))


def test_a_card_may_give_the_ranks_of_its_free_runs(tmp_path: Path) -> None:
    """09's cluster needs its 12 ranks for a free run to show anything; the others keep 4."""
    assert load_card(CARD_03).free_run_ranks == 4
    assert load_card(_card_with(tmp_path, "time_limit_s = 60", "time_limit_s = 60\nfree_run_ranks = 12")).free_run_ranks == 12
