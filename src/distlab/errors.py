"""The errors distlab raises on purpose, declared first so every layer can name them.

Each one carries a message that a learner can act on; the CLI prints it as one sentence and exits
with code 2 (usage or harness error). Failures of the learner's code are not errors of distlab:
they become failed checks (see grading/).
"""

from __future__ import annotations


class DistlabError(Exception):
    """Base of every error that the CLI reports as one clear sentence."""


class UsageError(DistlabError):
    """The command line asked for something that does not exist or does not make sense."""


class CardError(DistlabError):
    """A problem card (card.toml) or the course index is malformed; the message names the key."""


class HarnessError(DistlabError):
    """distlab itself could not do its job (launcher missing, a rank crashed before setup, ...)."""


class StateError(DistlabError):
    """The learner's workspace or progress file could not be read or written."""
