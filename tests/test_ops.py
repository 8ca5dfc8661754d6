"""Reduction ops behave like mpi4py's, and accept MPI's own constants."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distlab import MAX, SUM, ops


def test_reduce_local_folds_in_place_like_mpi() -> None:
    acc = np.array([1, 5, 3])
    SUM.Reduce_local(np.array([1, 1, 1]), acc)
    assert acc.tolist() == [2, 6, 4]
    MAX.Reduce_local(np.array([9, 0, 0]), acc)
    assert acc.tolist() == [9, 6, 4]


def test_reduce_local_works_on_torch_tensors() -> None:
    acc = torch.zeros(3)
    SUM.Reduce_local(torch.ones(3), acc)
    assert acc.tolist() == [1.0, 1.0, 1.0]


def test_resolve_accepts_mpi_ops_and_names() -> None:
    from mpi4py import MPI

    assert ops.resolve(MPI.SUM) is SUM
    assert ops.resolve(MPI.MAX) is MAX
    assert ops.resolve("max") is MAX
    with pytest.raises(TypeError, match="unsupported reduction op"):
        ops.resolve(object())


def test_as_numpy_rejects_other_types_clearly() -> None:
    with pytest.raises(TypeError, match="NumPy array or a CPU torch tensor"):
        ops.as_numpy([1, 2, 3])
