"""Each stage's state in a run directory, from its markers, records, manifest and saved plan.

States: done (its `_SUCCESS` key is the current key), stale (finished with another key: it re-runs
next time), running (started, and a `dflashx run` holds the run lock; `message` says what it waits
on, when it says: `waits`), interrupted (started, no run holds the lock: the process died; re-run
to resume), unfinished (the last attempt stopped at a limit of the recipe, e.g. the pilot's
generate at pilot.prompts / max_minutes: `message` says how far it got; the next run resumes it),
failed, pending, skipped-disabled.
`dflashx.report.progress.write_progress(run_dir)` renders them into PROGRESS.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dflashx.config.schema import STAGE_ORDER
from dflashx.plan.plan import PlanFileError
from dflashx.run.keys import stage_key
from dflashx.run.rundir import RunDir
from dflashx.store.manifest import ArtifactEntry, Manifest
from dflashx.run.watchdog import read_stall
from dflashx.track.records import read_records
from dflashx.track.waiting import describe, read_waiting

_STAGE_EVENTS = {"stage_start", "stage_end", "stage_failed", "stage_interrupted", "stage_skipped",
                 "stage_unfinished"}
_ENDED = {"stage_failed": "failed", "stage_interrupted": "interrupted", "stage_unfinished": "unfinished"}


@dataclass
class StageStatus:
    name: str
    state: str
    stage_key: str | None = None
    duration_s: float | None = None
    outputs: list[ArtifactEntry] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    message: str | None = None


class NotARunDir(ValueError):
    pass


def _seconds_since(ts: str) -> float:
    return (datetime.now(UTC) - datetime.fromisoformat(ts)).total_seconds()


def waits(stage_dir: Path) -> str | None:
    """What a running stage waits on: its live `_WAITING.json` (a lock, a server, the network), else
    the stall watchdog's last line (`_STALL.json`); None when it says neither."""
    declared = read_waiting(stage_dir)
    if declared is not None:
        return describe(declared)
    stall = read_stall(stage_dir)
    return str(stall["line"]).removeprefix("~ ") if stall else None


def run_status(run_dir: str | Path) -> list[StageStatus]:
    """One StageStatus per stage, in pipeline order."""
    rundir = RunDir(Path(run_dir))
    try:
        plan = rundir.plan()
    except PlanFileError as e:
        raise NotARunDir(str(e)) from None
    if plan is None:
        raise NotARunDir(f"{run_dir}: no plan.json here; is this a dflashx run directory (made by `dflashx run`)?")
    if plan.resolved is None:  # `dflashx run` saves only a plan that resolved
        raise NotARunDir(f"{run_dir}/plan.json: `resolved` is null, so no run was made from it; run "
                         f"`dflashx run RECIPE --run-dir {run_dir}` to plan and run it")
    resolved = plan.resolved
    manifest = Manifest.load(rundir.path)
    last: dict[str, dict[str, Any]] = {}
    ended: dict[str, dict[str, Any]] = {}
    for record in read_records(rundir.path):
        stage = record.get("stage")
        if record.get("event") in _STAGE_EVENTS and stage:
            last[stage] = record
            if record["event"] == "stage_end":
                ended[stage] = record
    locked = rundir.is_locked()
    rows = []
    for name in STAGE_ORDER:
        row = StageStatus(name, "pending", outputs=manifest.by_stage(name))
        event = last.get(name, {})
        success = rundir.success(name)
        current = stage_key(name, resolved, manifest).key
        if not getattr(resolved.stages, name).enabled:
            row.state = "skipped-disabled"
        elif success:
            row.stage_key = success.get("stage_key")
            row.state = "done" if row.stage_key == current else "stale"
            row.duration_s = success.get("duration_s")
            row.metrics = ended.get(name, {}).get("metrics") or {}
        elif event.get("event") == "stage_start":
            row.state = "running" if locked else "interrupted"
            row.stage_key = event.get("stage_key")
            row.duration_s = _seconds_since(event["ts"]) if locked else None
            row.message = waits(rundir.stage_dir(name)) if locked else None
        elif event.get("event") in _ENDED:
            row.state = _ENDED[event["event"]]
            row.stage_key, row.duration_s = event.get("stage_key"), event.get("duration_s")
            row.message, row.metrics = event.get("message"), event.get("metrics") or {}
        if row.stage_key is None and row.state == "pending":
            row.stage_key = current
        rows.append(row)
    return rows
