"""`dflashx run` through the real CLI (recipe loading and planner included) over fake stages."""

from __future__ import annotations

import json
import logging

import pytest
import test_run_fakes as fakes
from typer.testing import CliRunner

from dflashx.cli.main import app
from dflashx.run import orchestrator

@pytest.fixture(autouse=True)
def fake_stages(monkeypatch):
    monkeypatch.setattr(orchestrator, "load_stage", fakes.fake_load_stage)
    monkeypatch.setattr(logging.getLogger("dflashx"), "handlers", [])  # the CLI adds its console handler
    fakes.CALLS.clear()


@pytest.fixture
def recipe(tmp_path):
    source = fakes.write_prompts(tmp_path / "prompts.jsonl")
    return fakes.write_recipe(tmp_path / "recipe.yaml", source, name="cli-test")


def _run(*args: str):
    return CliRunner().invoke(app, ["run", *args])


def test_run_then_rerun_then_changed_lr(tmp_path, recipe):
    run_dir = tmp_path / "run"
    first = _run(str(recipe), "--run-dir", str(run_dir))
    assert first.exit_code == 0, first.output
    assert "+ export: done" in first.output and "all selected stages done" in first.output
    assert json.loads((run_dir / "plan.json").read_text())["resolved"]["name"] == "cli-test"
    again = _run(str(recipe), "--run-dir", str(run_dir))
    assert again.exit_code == 0 and again.output.count("(skipped)") == 7
    fakes.CALLS.clear()
    changed = _run(str(recipe), "train.lr=1e-4", "--run-dir", str(run_dir))
    assert changed.exit_code == 0 and dict(fakes.CALLS) == {"train": 1, "eval": 1, "export": 1}


def test_failure_exits_1(tmp_path, recipe):
    result = _run(str(recipe), "qc.thresholds.max_truncated_frac=0", "acknowledge=[generate_truncation]",
                  "--run-dir", str(tmp_path / "run"))
    assert result.exit_code == 1
    assert "x qc: failed: QC failed" in result.output and "Traceback" not in result.output


def test_plan_errors_refuse_to_run(tmp_path, recipe):
    result = _run(str(recipe), "drafter.target_layer_ids=[1,99]", "--run-dir", str(tmp_path / "run"))
    assert result.exit_code == 1 and "nothing was run" in result.output
    assert not (tmp_path / "run").exists() and not fakes.CALLS


def test_bad_recipe_and_bad_flags_exit_2(tmp_path, recipe):
    assert _run(str(recipe), "stages.train.lrr=1", "--run-dir", str(tmp_path / "run")).exit_code == 2
    bad = _run(str(recipe), "--only", "tokenise", "--run-dir", str(tmp_path / "run"))
    assert bad.exit_code == 2 and "did you mean 'tokenize'" in bad.output


def test_thinking_off_stops_before_anything_runs_unless_acknowledged(tmp_path, recipe):
    """The seeds' month-long mistake: the run refuses before the first stage, and says how to accept it."""
    off = _run(str(recipe), "target.chat_template.enable_thinking=false", "--run-dir", str(tmp_path / "off"))
    assert off.exit_code == 1 and "[thinking_off]" in off.output and "acknowledge: [thinking_off]" in off.output
    assert not (tmp_path / "off").exists() and not fakes.CALLS
    ok = _run(str(recipe), "target.chat_template.enable_thinking=false", "acknowledge=[thinking_off]",
              "--run-dir", str(tmp_path / "ack"))
    assert ok.exit_code == 0, ok.output
    assert "warning [thinking_off]" in ok.output and fakes.CALLS["generate"] == 1
