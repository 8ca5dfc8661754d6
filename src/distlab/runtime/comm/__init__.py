"""The learner's ``comm``: mpi4py's buffer API over an engine (``proxy.py``), and the layers each
call goes through: the counters (``stats.py``), the rank's state slot that the supervisor reads
(``rankstate.py``), the trace (runtime/trace) and the online clock (runtime/clock/online.py).
"""
