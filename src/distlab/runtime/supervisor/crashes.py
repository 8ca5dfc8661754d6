"""How a rank that ended without reporting died, and which one died first.

A rank that writes no outcome left by ``os._exit``, a fatal signal (its Python stack is in its
stack file: faulthandler writes it there), or a kill from outside. On MPI the launcher then ends
every other rank, and its output names the first process that died and how; on gloo each rank
is a process of the supervisor's own, whose exit status is known, while the others fail with
"Connection reset by peer" on the next message to it: the dead rank is the cause, not them.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from pathlib import Path

from ..jobspec import Job, learner_gone_path, outcome_path, stack_path
from .start import Processes

# Open MPI 5 (prterun): "Process name: [prterun-host-123@1,2]" then "Exit code: 3" for a non-zero
# exit; "process rank 2 with PID 77 on node host exited on signal 11 (Segmentation fault)."
_MPI_EXIT = re.compile(r"Process name:\s*\[[^\]]*@\d+,(\d+)\]\s*Exit code:\s*(\d+)")
_MPI_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on\s+signal (\d+)")


@dataclass(frozen=True)
class Death:
    rank: int
    exit_code: int | None = None
    signum: int | None = None
    learner_where: str = ""  # sealed: where its learner process was ("in Sendrecv"), as its agent saw
    engine_note: str = ""  # the engine call it died in, and what that engine does there (engine_abort)

    def describe(self) -> str:
        where = f"; its learner process died {self.learner_where}" if self.learner_where else ""
        where += f"; {self.engine_note}" if self.engine_note else ""
        if self.signum is not None:
            name = _SIGNAL_WORDS.get(self.signum) or signal.Signals(self.signum).name
            return f"rank {self.rank} died of {name} (signal {self.signum}) before reporting{where}"
        return (f"rank {self.rank} exited with status {self.exit_code} before reporting "
                f"(os._exit, or an exit in native code){where}")

    def located(self, job_dir: Path) -> "Death":
        """This death with where its learner process was, when a sealed rank's agent wrote it."""
        try:
            where = learner_gone_path(job_dir, self.rank).read_text().strip()[:200]
        except OSError:
            where = ""
        return Death(self.rank, self.exit_code, self.signum, where, self.engine_note)


_SIGNAL_WORDS: dict[int, str] = {
    signal.SIGSEGV: "a segmentation fault", signal.SIGABRT: "SIGABRT (abort() was called)",
    signal.SIGFPE: "a floating-point exception", signal.SIGBUS: "a bus error",
    signal.SIGKILL: "SIGKILL (out of memory, or killed from outside)",
}


# A frame of the comm proxy in a faulthandler dump: the API call the rank was in ("Recv").
_PROXY_FRAME = re.compile(r'/distlab/runtime/comm/proxy\.py", line \d+ in (\w+)')
# The calls that complete a receive: where gloo aborts on a message larger than the buffer.
_RECEIVING = {"Recv", "Sendrecv", "Sendrecv_replace", "Wait", "Waitall", "Waitany", "Waitsome", "Test",
              "Testall", "Testany"}


def engine_abort(job: Job, job_dir: Path, death: Death) -> Death:
    """A gloo rank that died of SIGABRT, with the call it died in: gloo aborts the process (no
    exception) when a message does not fit the buffer it is received into, which MPI reports as
    MPI_ERR_TRUNCATE. The call is read from the rank's stack dump (its agent's when sealed: the
    engine runs there), the frame of the comm proxy; the abort itself is in a thread of gloo's."""
    if job.backend != "gloo" or death.signum != signal.SIGABRT:
        return death
    path = stack_path(job_dir, death.rank)
    dump = _read(path.with_suffix(".agent.txt")) or _read(path)
    found = _PROXY_FRAME.search(dump)
    if found is None:
        return death
    call = found[1]
    note = f"it was in {call} on gloo" + (
        ", which aborts the process when a message is larger than the buffer it is received into (MPI says "
        "MPI_ERR_TRUNCATE): do the sender's dtype and shape match the receiver's?" if call in _RECEIVING else "")
    return Death(death.rank, death.exit_code, death.signum, death.learner_where, note)


def first_death(job: Job, job_dir: Path, procs: Processes, reported: set[int]) -> Death | None:
    """The rank that died first without reporting, and how, when the evidence names it."""
    if job.backend == "gloo":
        for rank, popen in enumerate(procs.popens):
            code = popen.poll()
            # A rank that failed writes its outcome and then exits: one that did so since the
            # last poll has a file to show for it, and is not the one that died.
            if rank not in reported and code not in (None, 0) and not outcome_path(job_dir, rank).exists():
                death = Death(rank, signum=-code) if code < 0 else Death(rank, exit_code=code)
                return engine_abort(job, job_dir, death.located(job_dir))
        return None
    log = launcher_log(job_dir)
    found = [(m.start(), Death(int(m[1]), exit_code=int(m[2]))) for m in _MPI_EXIT.finditer(log)]
    found += [(m.start(), Death(int(m[1]), signum=int(m[2]))) for m in _MPI_SIGNAL.finditer(log)]
    found = [(at, death) for at, death in found if death.rank not in reported]
    return min(found, key=lambda pair: pair[0])[1].located(job_dir) if found else None


def crash_cause(job_dir: Path, missing: list[int], procs: Processes) -> str:
    """How the ranks that never reported ended, when no first death is known."""
    blob = "\n".join(_read(stack_path(job_dir, rank)) for rank in missing)
    for needle, cause in (
        ("Aborted", "killed by SIGABRT (abort() was called)"),
        ("Segmentation fault", "segmentation fault"),
        ("Floating-point exception", "floating-point exception"),
        ("Bus error", "bus error"),
    ):
        if needle in blob:
            return cause
    codes = [p.returncode for p in procs.popens if p.returncode is not None and p.returncode < 0]
    if codes:
        return f"killed by signal {signal.Signals(-codes[0]).name}"
    log = launcher_log(job_dir)
    if "signal 9" in log or "Killed" in log:
        return "killed by SIGKILL (out of memory, or killed from outside)"
    return "the process exited without writing its outcome (os._exit or a signal)"


def stacks(job_dir: Path, world: int, only: list[int] | None = None) -> str:
    parts = []
    for rank in only if only is not None else range(world):
        trimmed = main_thread(_read(stack_path(job_dir, rank)))
        if trimmed:
            parts.append(f"rank {rank} stack (most recent call first):\n{trimmed}")
    return "\n".join(parts)


def main_thread(dump: str) -> str:
    """The frames of the thread that took the signal, without harness-internal frames. A fatal
    signal's dump starts with a "Fatal Python error" line of its own; its frames are under
    "Current thread"."""
    blocks = dump.split("\n\n")
    chosen = next((b for b in blocks if "Current thread" in b), "")
    chosen = chosen or next((b for b in blocks if "Fatal Python error" in b), "")
    lines = [
        line for line in chosen.splitlines()
        if line.startswith("  File") and "/distlab/runtime/" not in line
    ]
    return "\n".join(lines[:12])


def launcher_log(job_dir: Path) -> str:
    return _read(job_dir / "launcher.log")


def launcher_tail(job_dir: Path) -> str:
    text = launcher_log(job_dir)
    return "launcher output:\n" + "\n".join(text.strip().splitlines()[-15:]) if text else ""


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
