"""records.jsonl: append-only events, torn lines, JSON-safe metrics."""

from __future__ import annotations

import json

import numpy as np
import torch

from dflashx.track.records import RecordLog, jsonable, read_records


def test_append_and_read(tmp_path):
    log = RecordLog(tmp_path, "run-1")
    log.append("stage_start", stage="train", stage_key="k")
    log.append("metrics", stage="train", step=3, metrics={"loss": np.float32(0.5), "tokens": torch.tensor(7)})
    records = read_records(tmp_path)
    assert [r["event"] for r in records] == ["stage_start", "metrics"]
    assert records[1]["metrics"] == {"loss": 0.5, "tokens": 7} and records[1]["run_id"] == "run-1"
    assert records[0]["ts"].endswith("+00:00")


def test_torn_last_line_is_skipped(tmp_path):
    log = RecordLog(tmp_path, "r")
    log.append("run_start")
    with open(tmp_path / "records.jsonl", "a") as f:
        f.write('{"event": "metrics", "sta')  # a writer killed mid-line
    assert [r["event"] for r in read_records(tmp_path)] == ["run_start"]
    RecordLog(tmp_path, "r2").append("run_start")  # the next process ends the torn line first
    assert [r.get("run_id") for r in read_records(tmp_path)] == ["r", "r2"]
    assert read_records(tmp_path / "none") == []


def test_jsonable():
    value = {"nan": float("nan"), "inf": float("inf"), "arr": (1, 2.5), "obj": object, "b": True}
    out = jsonable(value)
    assert out["nan"] == "nan" and out["inf"] == "inf" and out["arr"] == [1, 2.5] and out["b"] is True
    json.dumps(out)
