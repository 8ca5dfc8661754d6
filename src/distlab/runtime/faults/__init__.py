"""Fault plans as data: the format and its validation (``model.py``), the seeded pure decisions
(``decide.py``), and parsing and loading plans (``plans.py``); docs/fault-plans.md.
"""
