"""What mpiexec starts for each rank when the supervisor keeps a zygote: it asks the zygote to fork
the rank with this process's environment (the launcher's PMIx variables among them) and standard
streams, forwards the signals it gets, and ends as the rank ended, with its exit code or its
signal, so that the launcher sees what it would have seen of the rank itself. The rank calls
MPI_Init with those variables; the launcher does not mind that it is not its own child. Run as a
script with ``-S -E`` (no site-packages, no distlab): it must start in milliseconds. Without a
zygote it becomes the rank worker itself (exec), as if it had never been there.
"""

# signal's C half: the module itself imports enum, 8 ms more of CPU (wire.py says why that counts).
import _signal as signal  # type: ignore[import-not-found]  # no stubs: signal.pyi covers the same calls
import os
import sys

import wire as zygote_wire  # type: ignore[import-not-found]  # this file's neighbour (the script's folder is first on sys.path)

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def main() -> None:
    argv = sys.argv[1:]
    try:
        conn = zygote_wire.connect(os.environ[zygote_wire.ZYGOTE_ENV], patience_s=5.0)
        pid = zygote_wire.ask(conn, argv, dict(os.environ), os.getcwd(), (0, 1, 2),
                              patience_s=120.0)
    except (KeyError, OSError, TimeoutError, zygote_wire.Refused):
        os.execv(sys.executable, [sys.executable, "-P", "-m", zygote_wire.RANK_MODULE, *argv])
    for signum in FORWARDED:
        signal.signal(signum, lambda number, _frame: _send(pid, number))
    code = zygote_wire.exit_code(zygote_wire.read_line(conn, None))
    if code is None:  # the zygote went away before the rank ended: it cannot be watched any more
        _send(pid, signal.SIGKILL)
        code = 1
    if code < 0:
        # Die of the rank's signal, as the launcher would have seen the rank die. SIGKILL (and
        # SIGSTOP) take no handler: setting one raised, and the stand-in exited with status 1,
        # which Open MPI's launcher takes for a failed rank and ends the job for, survivors or not.
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


def _send(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    main()
