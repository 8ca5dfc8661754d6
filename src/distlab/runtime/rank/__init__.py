"""One rank's process: joins the engine, loads the program and the learner's file, applies the
resource limits, runs the tasks and writes the outcome (``worker.py``, ``learner.py``,
``limits.py``). Started by the supervisor as ``python -m distlab.runtime.rank.worker``.
"""
