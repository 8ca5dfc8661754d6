"""The zygote: one process per supervisor that has imported what ranks import, from which each
rank is forked instead of started afresh (``server.py``); how to ask it for a rank (``wire.py``,
standard library only); the supervisor's side (``client.py``); and what mpiexec starts for each
rank while a zygote runs (``stand_in.py``). It imports nothing of the runtime: the rank worker it
runs is named, not imported, so that the supervisor may use it without reaching into a rank.
"""
