"""What a run tells the person watching it: the `RunObserver` protocol and a stage's `StageOutcome`.

The orchestrator and the pilot call an observer handed in by their caller (the CLI's is the terminal
view, `dflashx.report.console`; lines for library use are `dflashx.report.lines`), so `run/` never
prints. `SilentObserver` is the default: a run without a watcher.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

OK_STATES = ("done", "skipped", "disabled")


@dataclass
class StageOutcome:
    name: str
    state: str  # done | skipped | disabled | unfinished | failed
    stage_key: str | None = None
    message: str | None = None
    duration_s: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)  # the stage's result (or failure) metrics


class RunObserver(Protocol):
    """What a run reports to the person watching it, in order: `run_started`, then per stage
    `stage_started` (only when it runs), `stage_metrics` (each `ctx.log`), `stage_ended` (every
    stage, skipped ones too); `message` for anything else (a folder moved aside)."""

    def run_started(self, run_dir: Path, stages: Sequence[str]) -> None: ...
    def stage_started(self, name: str, key: str, reason: str | None, estimate_s: float | None) -> None: ...
    def stage_metrics(self, name: str, metrics: dict[str, Any], step: int | None) -> None: ...
    def stage_ended(self, outcome: StageOutcome) -> None: ...
    def message(self, text: str) -> None: ...


class SilentObserver:
    """A RunObserver that shows nothing (records.jsonl and PROGRESS.md still say everything)."""

    def run_started(self, run_dir: Path, stages: Sequence[str]) -> None: ...
    def stage_started(self, name: str, key: str, reason: str | None, estimate_s: float | None) -> None: ...
    def stage_metrics(self, name: str, metrics: dict[str, Any], step: int | None) -> None: ...
    def stage_ended(self, outcome: StageOutcome) -> None: ...
    def message(self, text: str) -> None: ...
