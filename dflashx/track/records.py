"""`records.jsonl`: the run's append-only event log, one JSON object per line, fsync'ed per event.

Every line has `ts` (ISO-8601 UTC), `event` and `run_id`; stage events also have `stage`.
Events written by the orchestrator (`dflashx.run`):
    run_start     argv, pid, host, stages (the selected stage names)
    stage_start   stage, stage_key, pid, host
    metrics       stage, step (int or null), metrics {name: value}   (from the stage's logger)
    stage_end     stage, stage_key, duration_s, metrics (the stage's result), outputs {name: {path, size}}
    stage_skipped stage, stage_key, reason ("done" | "disabled")
    stage_failed  stage, stage_key, duration_s, message, error ("StageFailed" or the exception type),
                  metrics
    stage_interrupted  stage, stage_key, duration_s
    warning       stage?, message
    run_end       ok, duration_s
Readers (status, PROGRESS.md, compare, calibrate) use `read_records`, which skips a torn last line
left by a killed process.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RECORDS_FILE = "records.jsonl"


def jsonable(value: Any) -> Any:
    """Make metric values JSON-safe: numpy/torch scalars -> Python numbers, NaN/inf -> strings."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return jsonable(item())
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


class RecordLog:
    """Appends events to `<run_dir>/records.jsonl`; each line is written and fsync'ed at once."""

    def __init__(self, run_dir: str | os.PathLike[str], run_id: str):
        self.path = Path(run_dir) / RECORDS_FILE
        self.run_id = run_id
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._end_torn_line()

    def _end_torn_line(self) -> None:
        """A writer killed mid-line leaves no newline: end that line so our events stay whole."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with open(self.path, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
                  "event": event, "run_id": self.run_id, **jsonable(fields)}
        line = json.dumps(record, ensure_ascii=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        return record


def iter_records(run_dir: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Events of a run in order; a torn or corrupt line (a killed writer) is skipped."""
    path = Path(run_dir) / RECORDS_FILE
    if not path.exists():
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record


def read_records(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    return list(iter_records(run_dir))
