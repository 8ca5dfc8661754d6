"""Job folders that outlive their supervisor, and the temporary files of the job's processes.

Every job gets a folder ``$TMPDIR/distlab-job-*``; the supervisor removes it when the job ends.
Two things could still leave files behind. Open MPI writes a session folder (``ompi.<pid>``)
under ``TMPDIR`` and removes it only when mpiexec exits on its own, which a job ended by SIGKILL
never does: so each job's processes get ``TMPDIR`` inside the job folder, and what they write
there goes with it. And a supervisor that is itself SIGKILLed removes nothing: so each job folder
names its supervisor's pid, and the next supervisor to start a job removes the folders whose
supervisor is gone.
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


def sweep_orphans_once() -> list[Path]:
    """Removes, once per process, the job folders of supervisors that no longer run."""
    global _swept
    if _swept:
        return []
    _swept = True
    return sweep_orphans(Path(tempfile.gettempdir()))


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
