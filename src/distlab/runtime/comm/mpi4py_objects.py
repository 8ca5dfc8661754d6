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
    if _mpi_ready() or _answers_itself(datatype):
        return int(datatype.Get_size())
    return np.dtype(_typecode(datatype)).itemsize


def datatype_name(datatype: Any) -> str:
    """The datatype's MPI name ("MPI_DOUBLE"), as ``Get_name`` gives it."""
    if not is_mpi_datatype(datatype):
        return repr(datatype)
    if _mpi_ready() or _answers_itself(datatype):
        return str(datatype.Get_name())
    from mpi4py import MPI

    name = next((n for n in dir(MPI) if n.isupper() and getattr(MPI, n) is datatype), None)
    return f"MPI_{name}" if name else f"an MPI datatype of code {_typecode(datatype)!r}"


def _answers_itself(datatype: Any) -> bool:
    """One of ``use_mpi_without_init``'s datatypes, which answer their size and name without MPI."""
    return bool(getattr(datatype, "_distlab_without_mpi", False))


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
    from its type code (``isinstance(t, MPI.Datatype)`` and ``t == MPI.DOUBLE`` still hold), and
    makes the derived datatypes that need no MPI to describe (a dup, a contiguous run). It refuses
    the other constructors of an instance (``MPI.DOUBLE.Create_vector``) with a TypeError; one of
    the class (``MPI.Datatype.Create_struct``) is MPI's, and ends the learner process as Open MPI
    ends a process that calls MPI before MPI_Init."""
    try:
        from mpi4py import MPI
    except ImportError:
        return
    setattr(MPI, "Status", status_class)

    class PredefinedDatatype(MPI.Datatype):  # type: ignore[misc]
        """A predefined datatype, read without MPI. ``Dup`` and ``Create_contiguous`` make
        datatypes of the same kind (a dup answers as its original; a contiguous one its size,
        and no type code, as MPI's), ``Commit`` and ``Free`` do nothing: each would be an MPI
        call, which ends a process without MPI. distlab's comm reads only a datatype's size and
        name (a buffer spec's datatype must have the array's item size, sealed or not)."""

        _distlab_name = ""
        _distlab_without_mpi = True

        def Get_size(self) -> int:  # noqa: N802
            return np.dtype(_typecode(self)).itemsize

        def Get_extent(self) -> tuple[int, int]:  # noqa: N802
            return 0, self.Get_size()

        def Get_name(self) -> str:  # noqa: N802
            return self._distlab_name

        def Set_name(self, name: str) -> None:  # noqa: N802
            self._distlab_name = str(name)

        def Dup(self) -> PredefinedDatatype:  # noqa: N802
            dup = type(self)(self)
            dup.__dict__.update(self.__dict__)
            dup._distlab_name = f"Dup {self.Get_name()}"  # as Open MPI names it
            return dup

        Create_dup = Dup

        def Create_contiguous(self, count: int) -> PredefinedDatatype:  # noqa: N802
            made = ContiguousDatatype(self)
            made._distlab_size = int(count) * self.Get_size()
            return made

        def Commit(self) -> PredefinedDatatype:  # noqa: N802
            return self

        def Free(self) -> None:  # noqa: N802
            return None

        size = property(lambda self: self.Get_size())
        extent = property(lambda self: self.Get_size())
        lb = property(lambda self: 0)
        ub = property(lambda self: self.Get_size())
        name = property(lambda self: self.Get_name())

    def needs_mpi(name: str) -> Any:
        def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
            raise TypeError(f"{name}: this derived datatype needs MPI, which the sealed learner "
                            "process does not start (distlab's comm takes NumPy arrays: a buffer "
                            "spec's datatype must have the array's item size; Dup and "
                            "Create_contiguous work)")
        return refuse

    for constructor in ("Create_vector", "Create_hvector", "Create_indexed", "Create_hindexed",
                        "Create_indexed_block", "Create_hindexed_block", "Create_subarray",
                        "Create_darray", "Create_resized", "Resized"):
        setattr(PredefinedDatatype, constructor, needs_mpi(constructor))

    class ContiguousDatatype(PredefinedDatatype):
        """Elements of a datatype side by side: their size, and no type code (MPI's has none)."""

        _distlab_size = 0

        def tocode(self) -> str:
            raise ValueError("cannot map to character code or type string")

        def Get_size(self) -> int:  # noqa: N802
            return self._distlab_size

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
