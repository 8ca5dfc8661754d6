"""``distlab calibrate``: this machine's transport measured and written down as a platform.

``command.py`` runs it (the call order is there) and prints the tables; ``measure.py`` makes the
measurements on real ranks through the front door; ``ranks.py`` is what those ranks run;
``fit.py`` fits alpha and beta; ``platform_file.py`` writes the platform and loads it back.
"""

from .command import check_arguments, run_calibration
from .fit import FULL_PLAN, QUICK_PLAN, Fit, Plan, fit_alpha_beta, powers, robust_fit
from .measure import RingRow
from .platform_file import MachineModel, default_output, platform_toml, write_platform

__all__ = [
    "FULL_PLAN", "QUICK_PLAN", "Fit", "MachineModel", "Plan", "RingRow", "check_arguments",
    "default_output", "fit_alpha_beta", "platform_toml", "powers", "robust_fit", "run_calibration",
    "write_platform",
]
