"""`dflashx status`: states from markers, records and keys, and the printed table."""

from __future__ import annotations

import pytest
import test_run_fakes as fakes
import typer
from typer.testing import CliRunner

from dflashx.cli import status as status_cli
from dflashx.run import orchestrator
from dflashx.run.status import NotARunDir, run_status
from dflashx.stages.base import Artifact, StageResult


@pytest.fixture(autouse=True)
def fake_stages(monkeypatch):
    monkeypatch.setattr(orchestrator, "load_stage", fakes.fake_load_stage)


@pytest.fixture
def source(tmp_path):
    return fakes.write_prompts(tmp_path / "prompts.jsonl")


def _cli(run_dir) -> tuple[int, str]:
    app = typer.Typer()
    app.command()(status_cli.command)
    result = CliRunner().invoke(app, [str(run_dir)], terminal_width=200)
    return result.exit_code, result.output


def test_done_stale_and_disabled(tmp_path, source):
    run_dir = tmp_path / "run"
    fakes.run(fakes.make_recipe(source), run_dir)
    fakes.run(fakes.make_recipe(source, **{"stages.train.lr": 1e-4}), run_dir, until="tokenize")
    states = {row.name: row.state for row in run_status(run_dir)}
    assert states == {"ingest": "done", "generate": "done", "qc": "done", "tokenize": "done", "train": "stale",
                      "eval": "done", "export": "done", "backup": "skipped-disabled"}
    code, out = _cli(run_dir)
    assert code == 0
    train_line = next(line for line in out.splitlines() if "train" in line and "stale" in line)
    assert "checkpoint (" in train_line and "final_loss=0.3333" in train_line


def test_failed_and_pending(tmp_path, source):
    run_dir = tmp_path / "run"
    fakes.run(fakes.make_recipe(source, **{"stages.qc.thresholds": {"max_truncated_frac": 0.0}}), run_dir)
    rows = {row.name: row for row in run_status(run_dir)}
    assert rows["qc"].state == "failed" and "QC failed" in rows["qc"].message
    assert rows["tokenize"].state == "pending" and rows["generate"].state == "done"
    assert rows["generate"].outputs[0].artifact == "completions" and rows["generate"].outputs[0].size > 0
    code, out = _cli(run_dir)
    assert code == 0 and "failed" in out and "QC failed" in out and "pending" in out


def test_not_a_run_dir(tmp_path):
    with pytest.raises(NotARunDir, match=r"no plan\.json"):
        run_status(tmp_path)
    code, out = _cli(tmp_path)
    assert code == 2 and "is this a dflashx run directory" in out


def _generate_stops_at_its_limit(ctx):
    fakes.generate(ctx)
    return StageResult({"completions": Artifact("completions")}, {"completions_total": 6},
                       unfinished="6 of 10 prompts completed (stages.generate.max_prompts / max_minutes); "
                                  "the next attempt resumes after them")


def test_a_stage_stopped_at_its_limit_is_unfinished_in_status_and_progress(tmp_path, source, monkeypatch):
    """The orchestrator's `stage_unfinished` record (the pilot's generate at pilot.prompts): status,
    PROGRESS.md (written at run_end while the lock is held) and `dflashx status` say unfinished and why."""
    monkeypatch.setattr(orchestrator, "load_stage", {**fakes.FAKES, "generate": _generate_stops_at_its_limit}.get)
    run_dir = tmp_path / "run"
    result = fakes.run(fakes.make_recipe(source), run_dir)
    assert [o.state for o in result.outcomes] == ["done", "unfinished"]
    rows = {row.name: row for row in run_status(run_dir)}
    generate = rows["generate"]
    assert generate.state == "unfinished" and generate.message.startswith("6 of 10 prompts completed")
    assert generate.duration_s is not None and generate.metrics == {"completions_total": 6}
    assert rows["qc"].state == "pending"
    progress = (run_dir / "PROGRESS.md").read_text()
    assert "| generate | unfinished | " in progress and "| 6 of 10 prompts completed" in progress
    assert "running" not in progress
    code, out = _cli(run_dir)
    line = next(line for line in out.splitlines() if "generate" in line)
    assert code == 0 and "unfinished" in line and "6 of 10 prompts completed" in line
