"""Parts of a long ``check.py``: sibling modules ``check_<part>.py`` in the problem's folder.

A problem's checks can outgrow one file (cases, cost models, rank programs, the checks). The
folder may then hold ``check_cases.py``, ``check_costs.py``, ...; ``check.py`` loads them with::

    from distlab.grading import check_part

    cases = check_part(__file__, "cases")   # problems/NN-slug/check_cases.py

A part is not importable by a plain ``import``: every problem would have its own
``check_cases``, and the supervisor loads several problems into one process. So each part gets a
module name unique to its problem (the same rule as check.py's own), registered once per process.
Ranks load check.py before they unpickle their tasks, which loads its parts under the same names:
rank programs, dataclasses and functions defined in a part travel between processes as they do
from check.py.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

from ..errors import CardError
from ..runtime.jobspec import program_module_name

PART_FILE = re.compile(r"check_[a-z][a-z0-9_]*\.py")


def check_part(check_file: str | Path, part: str) -> ModuleType:
    """The module ``check_<part>.py`` next to ``check_file``, loaded once per process."""
    path = Path(check_file).resolve().parent / f"check_{part}.py"
    if not PART_FILE.fullmatch(path.name):
        raise CardError(f"{path}: a part's name is lowercase letters, digits and _ ({part!r})")
    name = program_module_name(path)
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None or not path.is_file():
        raise CardError(f"{path}: no such part of {Path(check_file).name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # first: a part may load another part that loads it back
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
