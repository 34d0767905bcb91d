"""W&B per stage: offline files on disk, disabled mode, online without credentials, local records."""

from __future__ import annotations

from contextlib import nullcontext

import pytest

from dflashx.config.schema import TrackingSpec
from dflashx.track import wandb_stage
from dflashx.track.records import RecordLog, read_records
from dflashx.track.wandb_stage import effective_mode, stage_tracker


def _track(tmp_path, mode, fail=False):
    records = RecordLog(tmp_path, "run-7")
    tracking = TrackingSpec(project="dflashx-test", mode=mode)
    with pytest.raises(RuntimeError) if fail else nullcontext(), stage_tracker(
        records=records, tracking=tracking, run_id="run-7", stage="train", run_dir=tmp_path,
        config={"recipe": {"lr": 1e-3}, "plan": {"seconds": 9}},
    ) as t:
        t.log({"loss": 2.0}, step=0)
        t.log({"loss": 1.0}, step=1)
        t.summary({"final_loss": 1.0})
        if fail:
            raise RuntimeError("boom")
    return read_records(tmp_path)


def test_offline_run_files_appear(tmp_path):
    records = _track(tmp_path, "offline")
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert list(runs[0].glob("*.wandb")) and (runs[0] / "files").is_dir()
    assert [r["metrics"]["loss"] for r in records if r["event"] == "metrics"] == [2.0, 1.0]
    assert not [r for r in records if r["event"] == "warning"]


def test_offline_run_of_a_failing_stage(tmp_path):
    _track(tmp_path, "offline", fail=True)
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 1


def test_disabled_writes_only_records(tmp_path):
    records = _track(tmp_path, "disabled")
    assert not (tmp_path / "wandb").exists()
    assert len([r for r in records if r["event"] == "metrics"]) == 2


def test_online_without_credentials_falls_back(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    mode, warning = effective_mode(TrackingSpec(mode="online"))
    assert mode == "offline" and "no W&B credentials" in warning
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert effective_mode(TrackingSpec(mode="online")) == ("online", None)


def test_wandb_failure_never_stops_the_stage(monkeypatch, tmp_path):
    def broken(**kwargs):
        raise OSError("wandb service did not start")

    monkeypatch.setattr(wandb_stage, "_start_wandb", broken)
    records = _track(tmp_path, "offline")
    warnings = [r["message"] for r in records if r["event"] == "warning"]
    assert warnings and "W&B could not start (OSError" in warnings[0]
    assert len([r for r in records if r["event"] == "metrics"]) == 2
