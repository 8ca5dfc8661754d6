"""``distlab bench``: the figures and ratios behind the project's speed targets, each against a
baseline measured in the same run.

``suite.py`` runs everything and prints the table; ``mpi_ranks.py`` is the program every rank runs
under mpiexec, writing raw measurements; ``proxy_cost.py`` times the proxy's own Python per call;
``timings.py`` holds the sizes and the raw timings both sides share.
"""

from .suite import run_benchmarks

__all__ = ["run_benchmarks"]
