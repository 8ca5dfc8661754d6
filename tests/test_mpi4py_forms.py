"""Learner code as real course code writes it runs on distlab's comm as on mpi4py's own
COMM_WORLD: the lowercase object calls, Request.wait()/test(), barrier(), buffer specifications
([buf, MPI.DOUBLE]), statuses, keyword arguments and 2-D arrays. One table of call forms runs on
the proxy (both engines), sealed and not, and on a plain MPI.COMM_WORLD, and every rank's answers
must be the same. (Sealed, the learner process has mpi4py but no MPI: the root's bcast once failed
there, its pickle read-only, and a datatype's size or a status's count ended the process.)"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from distlab.grading import Task
from distlab.runs import Program, run, run_options
from distlab.runtime.supervisor import mpiexec_path, run_mpiexec

PROGRAMS = Path(__file__).resolve().parent / "programs.py"
RANKS = 3

# Every form returns plain data (lists, numbers, strings), so the answers compare as JSON.
FORMS = '''
import numpy as np


def objects(comm, MPI=None):
    r, p = comm.Get_rank(), comm.Get_size()
    right, left = (r + 1) % p, (r - 1) % p
    out = {}
    comm.barrier()
    if r == 0:
        comm.send({"from": 0, "list": [1, 2, 3]}, dest=1, tag=7)
    if r == 1:
        out["recv"] = comm.recv(source=0, tag=7)
    request = comm.isend(("isend", r), dest=right)
    incoming = comm.irecv(source=left)
    out["irecv"] = list(incoming.wait())
    request.wait()
    out["sendrecv"] = comm.sendrecv(f"hello from {r}", dest=right, source=left)
    out["bcast"] = comm.bcast({"root says": 42} if r == 0 else None, root=0)
    out["allgather"] = comm.allgather(r * r)
    out["gather"] = comm.gather(str(r), root=0)
    out["scatter"] = comm.scatter([[i] * i for i in range(p)] if r == 0 else None, root=0)
    out["allreduce"] = comm.allreduce(r + 1)
    out["allreduce_max"] = comm.allreduce(r * 10, op=MPI.MAX if MPI else None) if MPI else None
    out["reduce"] = comm.reduce(r, root=0)
    big = comm.bcast(list(range(50000)) if r == 0 else None, root=0)  # past the eager limit
    out["big"] = sum(big)
    probe = comm.isend(r, dest=right)
    got = comm.irecv(source=left)
    done, value = False, None
    while not done:
        done, value = got.test()
    probe.Wait()
    out["test"] = value
    return out


def buffers(comm, MPI):
    r, p = comm.Get_rank(), comm.Get_size()
    right, left = (r + 1) % p, (r - 1) % p
    out = {}
    grid = np.arange(12, dtype=np.float64).reshape(3, 4) * (r + 1)
    total = np.empty_like(grid)
    comm.Allreduce(grid, total)
    out["2d_allreduce"] = total.tolist()
    got = np.empty(4)
    comm.Sendrecv(sendbuf=np.full(4, float(r)), dest=right, recvbuf=got, source=left)
    out["sendrecv_keywords"] = got.tolist()
    spec = np.empty(4, dtype=np.int32)
    req = comm.Isend([np.full(4, r, dtype=np.int32), MPI.INT], right)
    comm.Recv([spec, MPI.INT], source=left)
    req.wait()
    out["buffer_spec"] = spec.tolist()
    part = np.zeros(6)
    comm.Bcast([part, 3, MPI.DOUBLE] if r else [np.arange(6.0), 3, MPI.DOUBLE], root=0)
    out["counted_spec"] = part.tolist()
    status, got = MPI.Status(), np.empty(2)
    req = comm.Isend(np.full(2, float(r)), right, tag=5)
    comm.Recv([got, MPI.DOUBLE], source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
    req.Wait()
    out["status"] = [status.Get_source(), status.Get_tag(), status.Get_count(MPI.DOUBLE), got.tolist()]
    # A message shorter than its buffer: the status counts what arrived, in bytes by default.
    short, wide = MPI.Status(), np.zeros(8)
    req = comm.Isend(np.full(3, float(r)), right, tag=6)
    comm.Recv(wide, source=left, tag=6, status=short)
    req.Wait()
    out["short_recv"] = [short.Get_count(MPI.DOUBLE), short.Get_count(), short.Get_count(MPI.BYTE), short.count]
    waited, wide = MPI.Status(), np.zeros(8)
    incoming = comm.Irecv(wide, source=left, tag=8)
    comm.Send(np.full(5, float(r)), dest=right, tag=8)
    incoming.Wait(waited)
    out["short_wait"] = [waited.Get_source(), waited.Get_count(MPI.DOUBLE), waited.Get_count()]
    paired, wide = MPI.Status(), np.zeros(8)
    comm.Sendrecv(np.full(2, float(r)), dest=right, sendtag=9, recvbuf=wide, source=left, recvtag=9,
                  status=paired)
    out["short_sendrecv"] = [paired.Get_count(MPI.DOUBLE), paired.Get_count()]
    out["datatypes"] = [MPI.DOUBLE.Get_size(), MPI.INT.size, MPI.FLOAT.Get_name(), MPI.FLOAT.Get_extent()]
    dup = MPI.DOUBLE.Dup().Commit()  # a derived datatype that needs no MPI to describe
    shared = np.arange(3.0) if r == 0 else np.zeros(3)
    comm.Bcast([shared, dup], root=0)
    out["dup"] = [shared.tolist(), dup.Get_size(), dup.Get_name(), dup.Get_extent()]
    dup.Free()
    return out
'''


def _on_proxy(tmp_path: Path, name: str, backend: str, seal: bool) -> list[dict]:
    solution = tmp_path / "forms.py"
    solution.write_text(FORMS)
    args = (name,) if backend == "gloo" else (name, "MPI")
    done = run(Program(PROGRAMS, "call_forms", solution), [Task(ranks=RANKS, case=args).for_ranks()],
               run_options(backend, seal=seal))
    assert done.ok, done.result.message
    return json.loads(json.dumps(done.tasks[0].values))


def _on_plain_mpi(tmp_path: Path, name: str) -> list[dict]:
    (tmp_path / "forms.py").write_text(FORMS)
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        from mpi4py import MPI
        sys.path.insert(0, {str(tmp_path)!r})
        import forms
        answers = MPI.COMM_WORLD.gather(forms.{name}(MPI.COMM_WORLD, MPI), root=0)
        if MPI.COMM_WORLD.rank == 0:
            print("ANSWERS " + json.dumps(answers))
    """))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = run_mpiexec([mpiexec_path(), "-n", str(RANKS), "--oversubscribe", "--bind-to", "none",
                       sys.executable, str(script)], env, timeout_s=60)
    assert out.returncode == 0, out.stdout + out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("ANSWERS "))
    return json.loads(line.removeprefix("ANSWERS "))


@pytest.mark.parametrize("name", ["objects", "buffers"])
def test_each_call_form_answers_on_the_proxy_as_on_plain_mpi4py(tmp_path: Path, name: str) -> None:
    plain = _on_plain_mpi(tmp_path, name)
    assert plain[1]["recv"] == {"from": 0, "list": [1, 2, 3]} if name == "objects" else plain
    for seal in (False, True):
        assert _on_proxy(tmp_path, name, "mpi", seal) == plain, "sealed" if seal else "unsealed"


def test_the_object_calls_run_on_gloo_too(tmp_path: Path) -> None:
    plain = _on_plain_mpi(tmp_path, "objects")
    for answers in plain:
        answers["allreduce_max"] = None  # needs MPI.MAX, which the gloo ranks do not import
    for seal in (False, True):
        assert _on_proxy(tmp_path, "objects", "gloo", seal) == plain, "sealed" if seal else "unsealed"


@pytest.mark.parametrize("seal", [False, True])
def test_a_contiguous_datatype_is_described_and_refused_the_same_sealed_or_not(
        tmp_path: Path, seal: bool) -> None:
    """Sealed, MPI's Create_contiguous would end the learner process (no MPI there): it is
    described without it, and a buffer spec with it meets the same item-size check."""
    solution = tmp_path / "contiguous.py"
    solution.write_text("import numpy as np\nfrom mpi4py import MPI\n\n\ndef work(comm):\n"
                        "    t = MPI.DOUBLE.Create_contiguous(3).Commit()\n"
                        "    comm.Bcast([np.zeros(6), 2, t], root=0)\n")
    done = run(Program(PROGRAMS, "call_solution", solution), [Task(ranks=2, case="work").for_ranks()],
               run_options("mpi", seal=seal))
    assert not done.ok
    assert "the array holds float64 (8 bytes each) but the datatype is  (24 bytes)" in \
        done.result.message, done.result.message


@pytest.mark.parametrize("seal", [False, True])
def test_a_buffer_spec_whose_datatype_does_not_fit_the_array_is_named(tmp_path: Path, seal: bool) -> None:
    # Sealed, the learner's MPI.FLOAT is a subclass of mpi4py's (mpi4py_objects.py), which the
    # check once took for no datatype at all: the float64 array went through as floats.
    solution = tmp_path / "wrong.py"
    solution.write_text("import numpy as np\nfrom mpi4py import MPI\n\n\ndef work(comm):\n"
                        "    comm.Bcast([np.zeros(4), MPI.FLOAT], root=0)\n")
    done = run(Program(PROGRAMS, "call_solution", solution), [Task(ranks=2, case="work").for_ranks()],
               run_options("mpi", seal=seal))
    assert not done.ok
    assert "the array holds float64 (8 bytes each) but the datatype is MPI_FLOAT (4 bytes)" in \
        done.result.message
