"""A W&B run per stage, grouped per pipeline run, next to the local JSONL record that is always kept.

`stage_tracker(...)` is a context manager yielding a `StageTracker`, whose `log(metrics, step)` is
the stage's metric logger (`StageContext.log`): each call appends a `metrics` event to
records.jsonl and, when W&B is on, logs to the stage's W&B run. `summary(metrics)` sets the W&B
summary. W&B runs are created with group=<run id>, job_type=<stage>, name=<run id>-<stage>,
dir=<run_dir> (files land in <run_dir>/wandb), config = the redacted resolved recipe + the stage's
plan estimates, mode from `tracking.mode` (offline by default; "online" without credentials falls
back to offline with a warning; "disabled" skips W&B). It never prompts, never captures the
console and never saves code. A W&B failure is recorded as a warning and never stops the stage.
"""

from __future__ import annotations

import netrc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from dflashx.config.schema import TrackingSpec
from dflashx.track.records import RecordLog, jsonable
from dflashx.track.redact import redact

QUIET_ENV = {"WANDB_SILENT": "true", "WANDB_CONSOLE": "off", "WANDB_DISABLE_CODE": "true"}


def has_wandb_credentials() -> bool:
    """An API key in the environment or a netrc entry for the W&B host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


Mode = Literal["offline", "online", "disabled"]  # TrackingSpec.mode's values, which wandb.init takes


def effective_mode(tracking: TrackingSpec) -> tuple[Mode, str | None]:
    """(mode to use, warning or None)."""
    if tracking.mode == "online" and not has_wandb_credentials():
        return "offline", ("tracking.mode is online but no W&B credentials were found (WANDB_API_KEY or ~/.netrc): "
                           "logging offline; `wandb sync` the run later")
    return tracking.mode, None


class StageTracker:
    """The metric logger handed to a stage: local record always, W&B when a run is open."""

    def __init__(self, records: RecordLog, stage: str, wandb_run: Any | None):
        self.records = records
        self.stage = stage
        self.wandb_run = wandb_run

    def __call__(self, metrics: dict[str, Any], step: int | None = None) -> None:
        self.log(metrics, step)

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        clean = jsonable(redact(metrics))
        self.records.append("metrics", stage=self.stage, step=step, metrics=clean)
        if self.wandb_run is not None:
            self._guard(lambda: self.wandb_run.log(clean, step=step))

    def summary(self, metrics: dict[str, Any]) -> None:
        if self.wandb_run is not None and metrics:
            clean = jsonable(redact(metrics))
            self._guard(lambda: self.wandb_run.summary.update(clean))

    def _guard(self, call: Any) -> None:
        try:
            call()
        except Exception as e:  # noqa: BLE001 - tracking never stops a stage
            self.records.append("warning", stage=self.stage, message=f"W&B call failed: {type(e).__name__}: {e}")
            self.wandb_run = None


def _start_wandb(*, tracking: TrackingSpec, mode: Mode, run_id: str, stage: str, run_dir: Path,
                 config: dict[str, Any]) -> Any:
    import wandb  # imported here: planning and status never need it

    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    return wandb.init(
        project=tracking.project, entity=tracking.entity, group=run_id, job_type=stage,
        name=f"{run_id}-{stage}", dir=str(run_dir), mode=mode, config=config,
        reinit="create_new",
        settings=wandb.Settings(silent=True, console="off", save_code=False, disable_git=True),
    )


@contextmanager
def stage_tracker(*, records: RecordLog, tracking: TrackingSpec, run_id: str, stage: str,
                  run_dir: Path, config: dict[str, Any]) -> Iterator[StageTracker]:
    """Open the stage's W&B run (unless disabled) and yield its tracker; the run is finished on exit
    (exit code 1 in W&B when the block raised)."""
    mode, warning = effective_mode(tracking)
    if warning:
        records.append("warning", stage=stage, message=warning)
    run = None
    if mode != "disabled":
        (run_dir / "wandb").mkdir(parents=True, exist_ok=True)
        try:
            run = _start_wandb(tracking=tracking, mode=mode, run_id=run_id, stage=stage, run_dir=run_dir,
                               config=jsonable(redact(config)))
        except Exception as e:  # noqa: BLE001 - tracking never stops a stage
            records.append("warning", stage=stage,
                           message=f"W&B could not start ({type(e).__name__}: {e}); metrics go to records.jsonl only")
    tracker = StageTracker(records, stage, run)
    failed = True
    try:
        yield tracker
        failed = False
    finally:
        if tracker.wandb_run is not None:
            tracker._guard(lambda: tracker.wandb_run.finish(exit_code=1 if failed else 0))
