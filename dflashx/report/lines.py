"""A run's stage lines as text: `start_line`, `outcome_line`, and `EchoObserver`, a `RunObserver`
(`dflashx.run.observer`) printing them through a function (library use, tests). The terminal view
(`dflashx.report.console`) prints the same lines."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dflashx.run.observer import StageOutcome


def start_line(name: str, key: str, reason: str | None) -> str:
    return f"> {name}: running (key {key[:12]}{'; ' + reason if reason else ''})"


def outcome_line(o: StageOutcome) -> str:
    """A stage's end as one line: `+` done, `=` skipped, `-` disabled, `x` failed."""
    if o.state == "done":
        return f"+ {o.name}: done in {o.duration_s or 0:.1f}s"
    if o.state == "skipped":
        return f"= {o.name}: done, key {(o.stage_key or '')[:12]} unchanged (skipped)"
    if o.state == "disabled":
        return f"- {o.name}: disabled (stages.{o.name}.enabled=false)"
    if o.state == "unfinished":
        return f"~ {o.name}: stopped at its limit in {o.duration_s or 0:.1f}s: {o.message}"
    return f"x {o.name}: {o.state}: {o.message}"


class EchoObserver:
    """A RunObserver printing the stage lines through `echo`."""

    def __init__(self, echo: Callable[[str], None] = print):
        self.echo = echo

    def run_started(self, run_dir: Path, stages: Sequence[str]) -> None: ...
    def stage_metrics(self, name: str, metrics: dict[str, Any], step: int | None) -> None: ...

    def stage_started(self, name: str, key: str, reason: str | None, estimate_s: float | None) -> None:
        self.echo(start_line(name, key, reason))

    def stage_ended(self, outcome: StageOutcome) -> None:
        self.echo(outcome_line(outcome))

    def message(self, text: str) -> None:
        self.echo(text)
