"""Benchmarks behind ``distlab bench``.

``mpi_ranks`` is the program that runs on every rank under mpiexec and writes raw measurements;
``distlab.bench`` starts it, times a real check, and turns both into figures, ratios and targets.
"""
