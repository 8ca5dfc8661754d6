"""How distlab writes to a terminal or a pipe: never a cut line, never an elided figure.

Rich assumes 80 columns when the output is not a terminal; for a pipe or a file that would fold
every table and wrap every long line where no screen limits them, so there the console is as
wide as the text (COLUMNS still rules when it is set). Tables fold a cell that does not fit
instead of ending it with "…", and code is printed whole (see ``print_code``).
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from rich.console import Console
from rich.table import Table

# "As wide as the text": wider than any line distlab prints, small enough for rich's layout.
PIPE_WIDTH = 4096
# A card (Markdown) reads best in a column; on a pipe it would otherwise be one line a paragraph.
READING_WIDTH = 100


def make_console(stream: TextIO | None = None) -> Console:
    out = stream or sys.stdout
    if not _is_tty(out) and "COLUMNS" not in os.environ:
        return Console(file=out, highlight=False, width=PIPE_WIDTH)
    return Console(file=out, highlight=False)


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream: not a terminal
        return False


def reading_width(console: Console) -> int:
    return min(console.width, READING_WIDTH)


def folding(table: Table) -> Table:
    """The table with every column wrapping, and folding a word too long for it, never eliding."""
    for column in table.columns:
        column.no_wrap = False
        column.overflow = "fold"
    return table


def print_code(console: Console, code: str) -> None:
    """Code is never wrapped or cut: a pipe or a file gets the text itself; a terminal gets it
    highlighted, each line as long as it is (a narrow terminal shows the long ones its own way)."""
    from rich.syntax import Syntax

    if not console.is_terminal:
        console.file.write(code)
        console.file.flush()
        return
    width = max((len(line) for line in code.expandtabs().splitlines()), default=1)
    syntax = Syntax(code, "python", line_numbers=True, code_width=width, word_wrap=False)
    console.print(syntax, crop=False, soft_wrap=True)
