"""The box table `dflashx plan` draws without rich: aligned columns, a bold total only on a terminal."""

from __future__ import annotations

import io

from dflashx.report.text_table import Styler, box_table


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_columns_are_aligned_and_numbers_right_justified():
    text = box_table("t", ["stage", "time"], [["generate", "12.6 d"], ["total", "27.3 d"]], [False, True],
                     style=Styler(io.StringIO()))
    lines = text.splitlines()
    assert lines[0].strip() == "t"
    assert len({len(line) for line in lines[1:]}) == 1  # every row as wide as the box
    assert "│ generate │ 12.6 d │" in lines and "│ total    │ 27.3 d │" in lines
    assert "\x1b[" not in text  # off a terminal: no codes


def test_on_a_terminal_the_header_and_total_are_bold_unless_no_color(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    text = box_table("t", ["a"], [["x"], ["total"]], [False], bold_last=True, style=Styler(Tty()))
    assert "\x1b[1mtotal\x1b[0m" in text and "\x1b[1ma " in text and "\x1b[1mx" not in text
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b[" not in box_table("t", ["a"], [["x"]], [False], style=Styler(Tty()))
