"""Job folders that outlive their supervisor, and the temporary files of the job's processes.

Every job gets a folder ``$TMPDIR/distlab-job-*``; the supervisor removes it when the job ends.
Three things could still leave files behind. Open MPI writes a session folder (``ompi.<pid>``)
under ``TMPDIR`` and removes it only when mpiexec exits on its own, which a job ended by SIGKILL
never does: so each job's processes get ``TMPDIR`` inside the job folder, and what they write
there goes with it. Its shared-memory transport keeps a segment per rank in /dev/shm
(``sm_segment.*``, 16 MiB each), which a rank that ends without MPI_Finalize never removes (a
failed rank ends at once: rank/worker.py): 5,000 of them (372 MiB of memory) had piled up on this
machine. So each job gets a folder of its own in /dev/shm too (``shared_memory_dir``), named as
its job folder, for those segments, and it goes with the job. And a supervisor that is itself
SIGKILLed removes nothing: so each of those folders names its supervisor's pid, and the next
supervisor to start a job removes the folders whose supervisor is gone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import psutil  # type: ignore[import-untyped]  # no stubs shipped

PREFIX = "distlab-job-"
OWNER_FILE = "supervisor.pid"
TMP_FOLDER = "tmp"
SHARED_MEMORY = Path("/dev/shm")

_swept = False


def new_job_dir() -> Path:
    """A fresh job folder owned by this process, with the processes' temporary folder inside."""
    sweep_orphans_once()
    job_dir = Path(tempfile.mkdtemp(prefix=PREFIX))
    claim(job_dir)
    return job_dir


def claim(job_dir: Path) -> Path:
    """Marks ``job_dir`` as this process's and returns its temporary folder for the ranks."""
    (job_dir / OWNER_FILE).write_text(str(os.getpid()))
    tmp = job_dir / TMP_FOLDER
    tmp.mkdir(exist_ok=True)
    return tmp


def shared_memory_dir(job_dir: Path) -> Path | None:
    """The job's folder for Open MPI's shared-memory segments (module docstring), made and
    claimed; None where there is no /dev/shm to write (Open MPI then uses its session folder,
    which is in the job folder)."""
    folder = SHARED_MEMORY / job_dir.name
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        (folder / OWNER_FILE).write_text(str(os.getpid()))
    except OSError:
        return None
    return folder


def remove_shared_memory_dir(job_dir: Path) -> None:
    shutil.rmtree(SHARED_MEMORY / job_dir.name, ignore_errors=True)


def sweep_orphans_once() -> list[Path]:
    """Removes, once per process, the job folders of supervisors that no longer run."""
    global _swept
    if _swept:
        return []
    _swept = True
    removed = sweep_orphans(Path(tempfile.gettempdir()))
    return removed + (sweep_orphans(SHARED_MEMORY) if SHARED_MEMORY.is_dir() else [])


def sweep_orphans(root: Path) -> list[Path]:
    removed = []
    for folder in root.glob(PREFIX + "*"):
        owner = _owner(folder)
        if owner is not None and not psutil.pid_exists(owner):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _owner(folder: Path) -> int | None:
    try:
        return int((folder / OWNER_FILE).read_text().strip())
    except (OSError, ValueError):
        return None  # not ours, or another version's: left alone
