"""Which engine a rank joins, from its launcher's environment (mpiexec's, or torchrun's variables),
and the engine itself (MPI_Init, or the gloo rendezvous). Engines are imported lazily: a rank
imports only the one it uses.
"""

from __future__ import annotations

import os

from ..engines.base import Engine


def detect_backend() -> tuple[str, int, int]:
    """(backend, rank, size) from the launcher's environment variables."""
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        return "mpi", int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    if "PMI_RANK" in os.environ:
        return "mpi", int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return "gloo", int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    raise SystemExit(
        "distlab.worker must be started by mpiexec/mpirun or torchrun (no rank in the environment)"
    )


def make_engine(backend: str, timeout_s: float = 1800.0) -> Engine:
    if backend == "mpi":
        from ..engines import mpi

        return mpi.world()
    from ..engines import gloo

    return gloo.world(timeout_s=timeout_s)
