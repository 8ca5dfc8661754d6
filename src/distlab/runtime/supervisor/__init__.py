"""The supervisor: starts a job's ranks, watches them, judges what it sees, and ends every process.

``launch.py`` is the poll loop; ``start.py`` how processes are started (mpiexec, or one process per
rank for gloo); ``judge.py`` the pure decisions (what a poll means, which signals are due);
``verdicts.py`` the result of a launch and its sentences (the failing rank, the wait-for graph,
the stacks); ``process_faults.py`` the signals of a fault plan; ``waitfor.py`` the wait-for graph;
``processes.py`` finding and killing a session's processes; ``mpi_monitoring.py`` Open MPI's own
counters, read after an exam run. Nothing here runs inside a rank: the ranks are other processes,
reached through their files and their state slots.
"""

from .launch import launch
from .start import mpi_env, mpiexec_failed_to_start, mpiexec_path, run_mpiexec
from .verdicts import LaunchResult

__all__ = ["LaunchResult", "launch", "mpi_env", "mpiexec_failed_to_start", "mpiexec_path", "run_mpiexec"]
