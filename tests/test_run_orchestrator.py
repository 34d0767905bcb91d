"""The orchestrator over fake stages: skip, changed parameters, failures, selection, tiers."""

from __future__ import annotations

import json
import shutil

import pytest
import test_run_fakes as fakes

from dflashx.config.schema import STAGE_ORDER
from dflashx.run import orchestrator
from dflashx.run.graph import select
from dflashx.store.manifest import Manifest
from dflashx.track.records import read_records

DONE_STAGES = [s for s in STAGE_ORDER if s != "backup"]


@pytest.fixture(autouse=True)
def fake_stages(monkeypatch):
    monkeypatch.setattr(orchestrator, "load_stage", fakes.fake_load_stage)
    fakes.CALLS.clear()


@pytest.fixture
def source(tmp_path):
    return fakes.write_prompts(tmp_path / "prompts.jsonl")


def test_full_run_registers_everything(tmp_path, source):
    run_dir = tmp_path / "run"
    result = fakes.run(fakes.make_recipe(source), run_dir)
    assert result.ok
    assert [o.state for o in result.outcomes] == ["done"] * 7 + ["disabled"]
    manifest = Manifest.load(run_dir)
    assert set(manifest.entries) == {"ingest.prompts", "ingest.eval_prompts", "generate.completions", "qc.report",
                                     "tokenize.dataset", "train.checkpoint", "train.logs", "eval.report",
                                     "export.drafter"}
    ckpt = manifest.entries["train.checkpoint"]
    assert ckpt.path == "train/checkpoint" and ckpt.kind == "dir" and ckpt.tier == "irreplaceable"
    # the held-out prompts: held-out τ measured while training (stages.train.tau_every)
    assert ckpt.inputs == ["tokenize.dataset", "ingest.eval_prompts"] and ckpt.regen_cost_usd is None
    assert manifest.entries["train.logs"].regen_cost_usd == 0.25  # replaceable: the plan's stage cost
    assert set(manifest.entries["eval.report"].inputs) == {"train.checkpoint", "ingest.eval_prompts"}
    for stage in DONE_STAGES:
        success = json.loads((run_dir / stage / "_SUCCESS").read_text())
        assert success["stage_key"] == result.outcomes[STAGE_ORDER.index(stage)].stage_key
        prov = json.loads((run_dir / stage / "provenance.json").read_text())
        assert prov["exit_state"] == "done" and prov["stage_key"] == success["stage_key"]
    assert (run_dir / "recipe.yaml").exists()
    assert json.loads((run_dir / "plan.json").read_text())["resolved"]["name"] == "fake"
    events = [(r["event"], r.get("stage")) for r in read_records(run_dir)]
    assert events[0] == ("run_start", None) and events[-1] == ("run_end", None)
    assert ("stage_end", "train") in events and ("stage_skipped", "backup") in events
    assert "export" in (run_dir / "PROGRESS.md").read_text()  # regenerated at the end of every run
    assert not [r for r in read_records(run_dir) if r["event"] == "warning"]
    train_metrics = [r for r in read_records(run_dir) if r["event"] == "metrics" and r["stage"] == "train"]
    assert [r["step"] for r in train_metrics] == [0, 1, 2]


def test_rerun_skips_finished_stages(tmp_path, source):
    recipe = fakes.make_recipe(source)
    fakes.run(recipe, tmp_path / "run")
    fakes.CALLS.clear()
    result = fakes.run(recipe, tmp_path / "run")
    assert result.ok and not fakes.CALLS
    assert [o.state for o in result.outcomes] == ["skipped"] * 7 + ["disabled"]


def test_changed_lr_reruns_train_and_later_only(tmp_path, source):
    run_dir = tmp_path / "run"
    first = fakes.run(fakes.make_recipe(source), run_dir)
    old_train_key = first.outcomes[STAGE_ORDER.index("train")].stage_key
    fakes.CALLS.clear()
    lines: list[str] = []
    result = fakes.run(fakes.make_recipe(source, **{"stages.train.lr": 1e-4}), run_dir, lines)
    assert result.ok
    assert dict(fakes.CALLS) == {"train": 1, "eval": 1, "export": 1}
    moved = f"train.superseded-{old_train_key[:8]}"
    assert (run_dir / moved / "checkpoint" / "model.json").exists()
    manifest = Manifest.load(run_dir)
    old = manifest.entries[f"train.checkpoint@{moved}"]
    assert old.tier == "garbage" and old.path == f"{moved}/checkpoint"
    assert json.loads((run_dir / "train/checkpoint/model.json").read_text())["lr"] == 1e-4
    assert any(line.startswith("~ train:") for line in lines)


def test_switching_hardware_reruns_nothing(tmp_path, source):
    fakes.run(fakes.make_recipe(source), tmp_path / "run")
    fakes.CALLS.clear()
    changed = fakes.make_recipe(source, hardware=fakes.OTHER_HW, **{"stages.generate.concurrency": 64})
    assert fakes.run(changed, tmp_path / "run").ok
    assert not fakes.CALLS


def test_moved_source_with_same_content_keeps_ingest(tmp_path, source):
    fakes.run(fakes.make_recipe(source), tmp_path / "run")
    moved = tmp_path / "elsewhere" / "prompts.jsonl"
    moved.parent.mkdir()
    shutil.move(source, moved)
    fakes.CALLS.clear()
    assert fakes.run(fakes.make_recipe(moved), tmp_path / "run").ok and not fakes.CALLS
    fakes.write_prompts(moved, n=8)  # edited content: ingest and everything fed by it re-run
    assert fakes.run(fakes.make_recipe(moved), tmp_path / "run").ok
    assert fakes.CALLS["ingest"] == 1 and fakes.CALLS["generate"] == 1 and fakes.CALLS["export"] == 1


def test_stage_failed_stops_later_stages(tmp_path, source):
    run_dir = tmp_path / "run"
    lines: list[str] = []
    recipe = fakes.make_recipe(source, **{"stages.qc.thresholds": {"max_truncated_frac": 0.0}})
    result = fakes.run(recipe, run_dir, lines)
    assert not result.ok
    assert [o.state for o in result.outcomes] == ["done", "done", "failed"]
    assert "tokenize" not in fakes.CALLS
    assert "QC failed: 1 check over its threshold" in result.outcomes[-1].message
    assert not (run_dir / "qc" / "_SUCCESS").exists() and not (run_dir / "qc" / "error.log").exists()
    failed = [r for r in read_records(run_dir) if r["event"] == "stage_failed"]
    assert failed[0]["error"] == "StageFailed" and failed[0]["metrics"] == {"truncated_frac": 0.1}
    assert json.loads((run_dir / "qc" / "provenance.json").read_text())["exit_state"] == "failed"
    assert any(line.startswith("x qc: failed: QC failed") for line in lines)


def test_crash_saves_traceback(tmp_path, source, monkeypatch):
    monkeypatch.setenv("FAKE_TRAIN_CRASH", "1")
    run_dir = tmp_path / "run"
    result = fakes.run(fakes.make_recipe(source), run_dir)
    assert result.outcomes[-1].state == "failed" and result.outcomes[-1].name == "train"
    assert result.outcomes[-1].message.startswith("ZeroDivisionError: loss scale underflow (traceback in ")
    assert "Traceback (most recent call last)" in (run_dir / "train" / "error.log").read_text()
    assert "eval" not in fakes.CALLS


def test_import_error_inside_a_stage_is_a_crash(tmp_path, source, monkeypatch):
    def load(name):
        raise ModuleNotFoundError("No module named 'sglang'", name="sglang")

    monkeypatch.setattr(orchestrator, "load_stage", load)
    result = fakes.run(fakes.make_recipe(source), tmp_path / "run")
    assert result.outcomes[0].state == "failed"
    assert result.outcomes[0].message.startswith("ModuleNotFoundError: No module named 'sglang' (traceback in ")
    assert "Traceback" in (tmp_path / "run" / "ingest" / "error.log").read_text()


def test_only_until_force(tmp_path, source):
    run_dir = tmp_path / "run"
    recipe = fakes.make_recipe(source)
    result = fakes.run(recipe, run_dir, until="generate")
    assert [o.name for o in result.outcomes] == ["ingest", "generate"]
    assert dict(fakes.CALLS) == {"ingest": 1, "generate": 1}
    fakes.CALLS.clear()
    only = fakes.run(recipe, run_dir, only="qc")
    assert [o.name for o in only.outcomes] == ["qc"] and dict(fakes.CALLS) == {"qc": 1}
    fakes.CALLS.clear()
    forced = fakes.run(recipe, run_dir, until="qc", force=["generate"])
    assert [o.state for o in forced.outcomes] == ["skipped", "done", "skipped"]
    assert dict(fakes.CALLS) == {"generate": 1}
    assert any(p.name.startswith("generate.superseded-") for p in run_dir.iterdir())


def test_missing_input_names_the_producer(tmp_path, source):
    recipe = fakes.make_recipe(source, **{"stages.generate.enabled": False})
    result = fakes.run(recipe, tmp_path / "run")
    assert [o.state for o in result.outcomes] == ["done", "disabled", "failed"]
    assert "stage qc needs generate.completions" in result.outcomes[-1].message
    assert "run (or enable) generate first" in result.outcomes[-1].message


def test_recipe_tier_override(tmp_path, source):
    recipe = fakes.make_recipe(source, **{"storage.tiers": {"generate.completions": "irreplaceable"}})
    fakes.run(recipe, tmp_path / "run", until="generate")
    entry = Manifest.load(tmp_path / "run").entries["generate.completions"]
    assert entry.tier == "irreplaceable" and entry.regen_cost_usd is None


def test_artifact_outside_stage_folder_is_rejected(tmp_path, source, monkeypatch):
    def bad(ctx):
        return fakes.StageResult({"prompts": fakes.Artifact("../recipe.yaml")})

    monkeypatch.setitem(fakes.FAKES, "ingest", bad)
    result = fakes.run(fakes.make_recipe(source), tmp_path / "run")
    assert result.outcomes[0].state == "failed" and "not an existing path inside" in result.outcomes[0].message


def test_artifact_the_graph_does_not_declare_is_rejected(tmp_path, source, monkeypatch):
    def undeclared(ctx):
        (ctx.out_dir / "extra.txt").write_text("x")
        return fakes.StageResult({"extra": fakes.Artifact("extra.txt")})

    monkeypatch.setitem(fakes.FAKES, "ingest", undeclared)
    result = fakes.run(fakes.make_recipe(source), tmp_path / "run")
    assert result.outcomes[0].state == "failed" and "does not declare" in result.outcomes[0].message


def test_select_rejects_bad_flags():
    with pytest.raises(ValueError, match="--only 'trian': unknown stage \\(did you mean 'train'\\?\\)"):
        select(only="trian")
    with pytest.raises(ValueError, match="not both"):
        select(only="qc", until="train")
    with pytest.raises(ValueError, match="--force eval: not among"):
        select(until="train", force=["eval"])


def test_run_dir_lock(tmp_path, source):
    from dflashx.run.rundir import RunDir, RunDirBusy

    rundir = RunDir(tmp_path / "run")
    rundir.ensure("fake")
    held = rundir.lock()
    try:
        assert rundir.is_locked()
        with pytest.raises(RunDirBusy, match="another `dflashx run`"):
            fakes.run(fakes.make_recipe(source), tmp_path / "run")
    finally:
        held.close()
    assert not rundir.is_locked()
