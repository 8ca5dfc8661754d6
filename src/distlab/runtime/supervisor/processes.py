"""Finding and ending every process of a job, including grandchildren that changed group.

Open MPI's launcher puts each rank in a process group of its own, so killing one group is not
enough; every job is started in a new *session* instead, and ending a job means killing every
process whose session id is the launcher's pid (read from /proc), plus any rank pid we were told.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from ..jobspec import learner_pid_path, pid_path


def session_members(sid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def kill_session(sid: int, extra_pids: list[int] = ()) -> None:  # type: ignore[assignment]
    """SIGKILLs the session's processes and ``extra_pids``; returns once they are gone (<= 2 s)."""
    deadline = time.monotonic() + 2.0
    while True:
        pids = set(session_members(sid)) | {p for p in extra_pids if alive(p)}
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] != "Z"


def signal_quietly(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def rank_pids(job_dir: Path, world: int) -> list[int]:
    """The pids the ranks wrote, of those that got that far, and of their learner processes
    (sealed ranks: the learner's stack is the one a rank's stack file shows)."""
    pids = []
    for rank in range(world):
        for path in (pid_path(job_dir, rank), learner_pid_path(job_dir, rank)):
            try:
                pids.append(int(path.read_text()))
            except (OSError, ValueError):
                pass
    return pids
