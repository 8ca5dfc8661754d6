"""Virtual time: the network model and its fair-share solver, the replay that turns every rank's
events into graded times, the collectives' schedules and cost formulas, the online clock a rank
keeps while it runs, and the metrics read from a replay.
"""
