"""A box-drawn text table and styled lines without rich, for `dflashx plan`'s view.

`dflashx plan` is the command people run after every edit of a recipe, and its start-up budget
(0.5 s, benchmarks/cli_latency.py) cannot carry rich's import and layout (about 40 ms on 2 cores).
The other reports keep rich. On a terminal, bold and colour are ANSI codes; off one (a pipe, a
file, a test's runner) there are none, as with `report.fmt.wide_console`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import IO

_CODES = {"bold": "1", "red": "31", "green": "32", "yellow": "33"}


class Styler:
    """Wraps text in ANSI codes when `stream` is a terminal (and NO_COLOR is not set)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        stream = stream if stream is not None else sys.stdout
        self.on = bool(getattr(stream, "isatty", lambda: False)()) and "NO_COLOR" not in os.environ

    def __call__(self, text: str, style: str) -> str:
        return f"\x1b[{_CODES[style]}m{text}\x1b[0m" if self.on and text else text


def box_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool],
              bold_last: bool = False, style: Styler | None = None) -> str:
    """`headers` and `rows` in a heavy-headed box, columns right-aligned where `right` says, the
    title centred above; `bold_last` sets the last row (a total) in bold."""
    style = style or Styler()
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str], edge: str, sep: str, bold: bool = False) -> str:
        padded = [(c.rjust(w) if r else c.ljust(w)) for c, w, r in zip(cells, widths, right)]
        return edge + sep.join(f" {style(p, 'bold') if bold else p} " for p in padded) + edge

    def rule(left: str, fill: str, mid: str, end: str) -> str:
        return left + mid.join(fill * (w + 2) for w in widths) + end

    inner = sum(widths) + 3 * len(widths) + 1
    out = [title.center(inner).rstrip(), rule("┏", "━", "┳", "┓"), line(headers, "┃", "┃", bold=True),
           rule("┡", "━", "╇", "┩")]
    out += [line(r, "│", "│", bold=bold_last and i == len(rows) - 1) for i, r in enumerate(rows)]
    out.append(rule("└", "─", "┴", "┘"))
    return "\n".join(out)
