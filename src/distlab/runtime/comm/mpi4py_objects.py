"""mpi4py's datatypes and statuses where MPI may not be initialized: a sealed learner process.

Learner code passes mpi4py's objects to ``comm`` (``[buf, MPI.DOUBLE]``, ``status=MPI.Status()``,
``status.Get_count(MPI.DOUBLE)``). Unsealed, MPI is initialized in the rank and every method of
theirs works. Sealed, the learner process never initializes MPI (runtime/rank/learner_main.py),
and Open MPI ends a process that calls ``MPI_Type_size`` or ``MPI_Get_count`` before
``MPI_Init`` ("Local abort before MPI_INIT completed", exit status 14): a program that ran
unsealed died sealed with no word of why. So a datatype's size and name are read from mpi4py's
own table of predefined types (``tocode``, which calls no MPI function) where MPI is not
initialized, and there ``MPI.Status`` is distlab's and each predefined datatype answers its size
and name itself (``use_mpi_without_init``).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _mpi_ready() -> bool:
    from mpi4py import MPI

    return bool(MPI.Is_initialized()) and not MPI.Is_finalized()


def is_mpi_datatype(datatype: Any) -> bool:
    """mpi4py's datatype, or a subclass of it (a predefined one in a sealed learner: below)."""
    return hasattr(datatype, "tocode") and any(k.__module__.startswith("mpi4py") for k in type(datatype).__mro__)


def datatype_size(datatype: Any) -> int:
    """Bytes per element of an mpi4py datatype, or of anything NumPy reads as a dtype."""
    if not is_mpi_datatype(datatype):
        return np.dtype(datatype).itemsize
    if _mpi_ready():
        return int(datatype.Get_size())
    return np.dtype(_typecode(datatype)).itemsize


def datatype_name(datatype: Any) -> str:
    """The datatype's MPI name ("MPI_DOUBLE"), as ``Get_name`` gives it."""
    if not is_mpi_datatype(datatype):
        return repr(datatype)
    if _mpi_ready():
        return str(datatype.Get_name())
    from mpi4py import MPI

    name = next((n for n in dir(MPI) if n.isupper() and getattr(MPI, n) is datatype), None)
    return f"MPI_{name}" if name else f"an MPI datatype of code {_typecode(datatype)!r}"


def _typecode(datatype: Any) -> str:
    try:
        return str(datatype.tocode())
    except ValueError:  # a derived datatype: only an initialized MPI makes one
        raise TypeError("a derived MPI datatype cannot be read without MPI (under the seal, pass "
                        "a predefined one such as MPI.DOUBLE, or none)") from None


def use_mpi_without_init(status_class: type) -> None:
    """Makes mpi4py usable in this process, where MPI stays uninitialized: ``MPI.Status`` becomes
    distlab's ``status_class`` (mpi4py's calls MPI in ``Get_count``), and each predefined
    datatype (MPI.DOUBLE, ...) a subclass of mpi4py's own that answers its size, extent and name
    from its type code (``isinstance(t, MPI.Datatype)`` and ``t == MPI.DOUBLE`` still hold)."""
    try:
        from mpi4py import MPI
    except ImportError:
        return
    setattr(MPI, "Status", status_class)

    class PredefinedDatatype(MPI.Datatype):  # type: ignore[misc]
        """A predefined datatype, read without MPI."""

        _distlab_name = ""

        def Get_size(self) -> int:  # noqa: N802
            return np.dtype(_typecode(self)).itemsize

        def Get_extent(self) -> tuple[int, int]:  # noqa: N802
            return 0, self.Get_size()

        def Get_name(self) -> str:  # noqa: N802
            return self._distlab_name

        size = property(Get_size)
        extent = property(lambda self: self.Get_size())
        lb = property(lambda self: 0)
        ub = property(lambda self: self.Get_size())
        name = property(Get_name)

    for attribute in dir(MPI):
        datatype = getattr(MPI, attribute)
        if type(datatype) is MPI.Datatype and attribute.isupper():
            try:
                np.dtype(datatype.tocode())
            except (ValueError, TypeError):
                continue  # no NumPy type (MPI.PACKED, MPI.DATATYPE_NULL...): left as it is
            safe = PredefinedDatatype(datatype)
            safe._distlab_name = f"MPI_{attribute}"
            setattr(MPI, attribute, safe)
