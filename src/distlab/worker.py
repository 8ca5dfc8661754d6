"""``python -m distlab.worker``: the rank entry point, short name for external launchers."""

import sys

from .runtime.rank.worker import main

if __name__ == "__main__":
    sys.exit(main())
