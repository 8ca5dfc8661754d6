"""Learner code written against distlab's comm runs unchanged on mpi4py's own MPI.COMM_WORLD,
and the rank entry point runs under an external mpirun as on a real cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO

from distlab.runtime.supervisor import mpiexec_path, run_mpiexec

MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_mpi_yield_when_idle="1")


def test_the_reference_allreduce_runs_on_plain_mpi4py(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent(f"""
        import importlib.util, numpy as np
        from mpi4py import MPI
        spec = importlib.util.spec_from_file_location("ref", "{REPO}/problems/03-ring-allreduce/reference.py")
        ref = importlib.util.module_from_spec(spec); spec.loader.exec_module(ref)
        comm = MPI.COMM_WORLD
        for n in (0, 1, 2, 7, 100003):
            for op in (MPI.SUM, MPI.MAX):
                buf = np.arange(n, dtype=np.int64) * (comm.rank + 1)
                want = np.empty_like(buf)
                comm.Allreduce(buf, want, op)
                ref.allreduce(comm, buf, op)        # plain MPI.COMM_WORLD and MPI.SUM/MAX
                assert np.array_equal(buf, want), (n, op)
        if comm.rank == 0:
            print("plain mpi4py ok")
    """))
    out = run_mpiexec(
        [mpiexec_path(), "-n", "3", "--oversubscribe", "--bind-to", "none", sys.executable, str(script)],
        MPI_ENV, timeout_s=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "plain mpi4py ok" in out.stdout


def test_the_worker_runs_under_an_external_mpirun() -> None:
    out = run_mpiexec(
        [mpiexec_path(), "-n", "3", "--oversubscribe", "--bind-to", "none", sys.executable,
         "-m", "distlab.worker", "--problem", "03", "--solution", "reference", "--param", "n=10007"],
        MPI_ENV, timeout_s=60, cwd=REPO,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ranks=3 backend=mpi" in out.stdout
    assert "matches the sum of all inputs" in out.stdout


def test_the_worker_exits_non_zero_under_an_external_mpirun_when_the_result_is_wrong() -> None:
    # The starter leaves every buffer as it was: rank 0 finds the sum wrong.
    out = run_mpiexec(
        [mpiexec_path(), "-n", "2", "--oversubscribe", "--bind-to", "none", sys.executable,
         "-m", "distlab.worker", "--problem", "03", "--solution", "starter", "--param", "n=1001"],
        MPI_ENV, timeout_s=60, cwd=REPO,
    )
    assert "DIFFERS FROM the sum of all inputs" in out.stdout, out.stdout + out.stderr
    assert out.returncode != 0, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr


@pytest.mark.parametrize("summary, wrong", [
    ("n=8 float64: matches the sum of all inputs; 1.00 ms wall on rank 0", False),
    ("n=8 float64: DIFFERS FROM the sum of all inputs; 1.00 ms wall on rank 0", True),
    ("40 steps on 4 ranks: global-batch loss 0.1 ... replicas DIFFER across ranks", True),
    ("the differences are small", False),
    ({"auc": 0.9}, False),
    ({"auc": 0.5, "ok": False}, True),
    (None, False),
])
def test_a_summary_says_whether_the_result_is_wrong(summary: object, wrong: bool) -> None:
    from distlab.runtime.rank.worker import summary_is_wrong

    assert summary_is_wrong(summary) is wrong


def test_the_readme_names_the_flags_mpirun_needs_as_root_and_on_few_cores() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## On a real cluster"):readme.index("## Benchmarks")]
    assert "--oversubscribe" in section
    assert "--allow-run-as-root" in section or "OMPI_ALLOW_RUN_AS_ROOT" in section
    assert "exit" in section  # and says what the exit status means


def test_the_worker_runs_under_torchrun() -> None:
    torchrun = Path(sys.executable).parent / "torchrun"
    out = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "distlab.worker",
         "--problem", "03", "--solution", "reference", "--param", "n=1001"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ranks=2 backend=gloo" in out.stdout
    assert "matches the sum of all inputs" in out.stdout
