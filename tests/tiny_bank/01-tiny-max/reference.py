"""Tiny problem 01, reference: each rank sends its value to every other rank."""

import numpy as np


def largest(comm, x):
    best, incoming = float(x), np.empty(1)
    for step in range(1, comm.Get_size()):
        right = (comm.Get_rank() + step) % comm.Get_size()
        left = (comm.Get_rank() - step) % comm.Get_size()
        comm.Sendrecv(np.array([float(x)]), dest=right, recvbuf=incoming, source=left)
        best = max(best, incoming[0])
    return best
