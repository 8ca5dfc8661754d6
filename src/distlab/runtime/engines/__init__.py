"""The real communication engines under the learner's ``comm``: MPI (mpi4py) and torch.distributed.

Both implement :class:`distlab.runtime.engines.base.Engine` on contiguous NumPy arrays; the proxy in
``runtime/comm`` turns learner buffers (arrays, CPU tensors) into those before calling in.
"""

from __future__ import annotations

from .base import Engine, EngineRequest

__all__ = ["Engine", "EngineRequest", "BACKENDS"]

BACKENDS = ("mpi", "gloo")
