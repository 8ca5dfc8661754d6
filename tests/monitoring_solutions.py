"""Solutions for tests/test_mpi_monitoring.py, called through programs.call_solution(comm, ...).

The bypassing ones reach mpi4py through importlib with a built name, so the static import scan
(exam.bypasses) finds nothing: only Open MPI's own counters can catch them.
"""

from __future__ import annotations

import importlib

import numpy as np


def honest(comm, n):
    """Every kind of call the proxy forwards: blocking and nonblocking point to point, a message to
    itself, and built-in collectives (blocking and nonblocking)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    out = np.full(n, float(rank))
    got = np.empty(n)
    comm.Sendrecv(out, dest=right, recvbuf=got, source=left)
    request = comm.Irecv(got, source=left, tag=4)
    comm.Isend(out, dest=right, tag=4).Wait()
    request.Wait()
    if rank == 0:
        comm.Send(out, dest=0, tag=9)
        comm.Recv(got, source=0, tag=9)
    comm.Allreduce(out, got)
    comm.Bcast(got, root=0)
    comm.Iallreduce(out, got).Wait()
    comm.Barrier()
    return float(got[0])


def _mpi():
    return importlib.import_module("mpi" + "4py.MPI")


def world_allreduce(comm, n):
    """Sums on MPI_COMM_WORLD itself when the task spans the whole job, as a cheat would."""
    mpi = _mpi()
    out, got = np.ones(n), np.empty(n)
    mpi.COMM_WORLD.Allreduce(out, got)
    return float(got[0])


def world_sendrecv(comm, n):
    """One ring step on MPI_COMM_WORLD, around the proxy."""
    world = _mpi().COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    out, got = np.ones(n), np.empty(n)
    world.Sendrecv(out, dest=(rank + 1) % size, recvbuf=got, source=(rank - 1) % size)
    return float(got[0])
