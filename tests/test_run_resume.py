"""Kill a run mid-stage (SIGKILL, a real subprocess), then resume it; outdated partial output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import test_run_fakes as fakes

from dflashx.run import orchestrator
from dflashx.run.status import run_status
from dflashx.store.manifest import Manifest
from dflashx.track.records import read_records

TESTS = Path(__file__).resolve().parent
CHILD = f"""
import sys
from pathlib import Path
sys.path.insert(0, {str(TESTS)!r})
import dflashx.run.orchestrator as orchestrator
import test_run_fakes as fakes
orchestrator.load_stage = fakes.fake_load_stage
fakes.run(fakes.make_recipe(Path(sys.argv[1])), Path(sys.argv[2]))
"""


@pytest.fixture(autouse=True)
def fake_stages(monkeypatch):
    monkeypatch.setattr(orchestrator, "load_stage", fakes.fake_load_stage)
    fakes.CALLS.clear()


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _kill_during_generate(source: Path, run_dir: Path, min_lines: int = 3) -> None:
    env = {**os.environ, "FAKE_GENERATE_DELAY": "0.2"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(source), str(run_dir)], env=env)
    part = run_dir / "generate" / "completions" / "part-0.jsonl"
    deadline = time.monotonic() + 60
    try:
        while len(_lines(part)) < min_lines:
            assert child.poll() is None, "the child run ended before it could be killed"
            assert time.monotonic() < deadline, "the child run made no progress"
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL


def test_sigkill_mid_stage_then_resume(tmp_path):
    source = fakes.write_prompts(tmp_path / "prompts.jsonl", n=32)
    run_dir = tmp_path / "run"
    _kill_during_generate(source, run_dir)
    written = len(_lines(run_dir / "generate" / "completions" / "part-0.jsonl"))
    assert 3 <= written < 30
    assert not (run_dir / "generate" / "_SUCCESS").exists()
    states = {row.name: row.state for row in run_status(run_dir)}
    assert states["ingest"] == "done" and states["generate"] == "interrupted" and states["qc"] == "pending"

    result = fakes.run(fakes.make_recipe(source), run_dir)
    assert result.ok
    assert "ingest" not in fakes.CALLS and fakes.CALLS["generate"] == 1
    rows = _lines(run_dir / "generate" / "completions" / "part-0.jsonl")
    assert len(rows) == 30 and len({r["id"] for r in rows}) == 30  # appended, no duplicates
    end = [r for r in read_records(run_dir) if r["event"] == "stage_end" and r["stage"] == "generate"][-1]
    assert end["metrics"]["resumed_from"] >= written
    assert not any(p.name.startswith("generate.superseded") for p in run_dir.iterdir())


def test_partial_output_of_an_outdated_key_becomes_garbage(tmp_path):
    source = fakes.write_prompts(tmp_path / "prompts.jsonl", n=32)
    run_dir = tmp_path / "run"
    _kill_during_generate(source, run_dir)
    started = json.loads((run_dir / "generate" / "_STARTED").read_text())["stage_key"]
    result = fakes.run(fakes.make_recipe(source, **{"stages.generate.temperature": 0.9}), run_dir)
    assert result.ok
    moved = f"generate.superseded-{started[:8]}"
    entry = Manifest.load(run_dir).entries[f"generate.partial@{moved}"]
    assert entry.tier == "garbage" and entry.sha256 is None and entry.size > 0 and entry.path == moved
    rows = _lines(run_dir / "generate" / "completions" / "part-0.jsonl")
    assert len(rows) == 30 and all(r["answer"].endswith("-t0.9") for r in rows)


def test_ctrl_c_records_the_interruption(tmp_path, monkeypatch):
    def interrupted(ctx):
        (ctx.out_dir / "half.txt").write_text("partial")
        raise KeyboardInterrupt

    monkeypatch.setitem(fakes.FAKES, "generate", interrupted)
    run_dir = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        fakes.run(fakes.make_recipe(fakes.write_prompts(tmp_path / "p.jsonl")), run_dir)
    events = [r["event"] for r in read_records(run_dir)]
    assert events[-2:] == ["stage_interrupted", "run_end"]
    assert json.loads((run_dir / "generate" / "provenance.json").read_text())["exit_state"] == "interrupted"
    assert {r.name: r.state for r in run_status(run_dir)}["generate"] == "interrupted"
    assert (run_dir / "generate" / "half.txt").exists()  # kept for the resume
