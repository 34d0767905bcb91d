"""`dflashx pilot` runs through the run's orchestrator, executor and lock (issue 30): another process
holding the run lock stops it (RunDirBusy), its stage folders carry the orchestrator's markers and keys
(the run's generate stage left unfinished under the run's key, the scratch stages finished in pilot/),
and a pilot SIGKILLed (its process group) mid-generation and mid-training resumes to the end without
a duplicate completion. Real processes and stages on the tiny recipe; generation over HTTP to the
scripted OpenAI-compatible server (tests/openai_server.py: SGLang itself needs GPUs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from openai_server import Script, ScriptedOpenAIServer
from test_pilot import PILOT, PROMPTS, invoke, tiny_file

from dflashx.data.jsonl import iter_shards
from dflashx.store.manifest import Manifest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
HOLD = ("import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('held', flush=True); time.sleep(600)")


def _ids(run_dir: Path) -> list[str]:
    folder = run_dir / "generate" / "completions"
    return [c["id"] for c in iter_shards(folder)] if folder.is_dir() else []


def _marker(folder: Path, name: str) -> dict | None:
    path = folder / name
    return json.loads(path.read_text()) if path.is_file() else None


def _pilot_killed_when(recipe: Path, ready: Callable[[], bool]) -> None:
    """`dflashx pilot` in its own process group, SIGKILLed once `ready()`."""
    proc = subprocess.Popen([sys.executable, "-m", "dflashx.cli.main", "pilot", str(recipe), "--skip-preflight"],
                            cwd=REPO, env=os.environ | {"PYTHONPATH": str(REPO)}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not ready():
        assert proc.poll() is None, "the pilot ended before the kill"
        assert time.monotonic() < deadline, "the kill point never came"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.timeout(400)
def test_the_pilot_runs_under_the_run_lock_with_the_orchestrators_markers(tmp_path):
    with ScriptedOpenAIServer(Script()) as server:
        recipe = tiny_file(tmp_path, stages__generate__backend="sglang", stages__generate__urls=[server.url])
        run_dir = tmp_path / "runs" / "tiny"
        run_dir.mkdir(parents=True)
        holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir / ".lock")], stdout=subprocess.PIPE,
                                  text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            busy = invoke("pilot", str(recipe), "--skip-preflight")
        finally:
            holder.kill()
            holder.wait()
        assert busy.exit_code == 1 and "pilot: another `dflashx run`" in busy.output, busy.output
        assert not (run_dir / "ingest").exists() and server.requests == []

        done = invoke("pilot", str(recipe), "--skip-preflight", "--continue-over-budget")
        assert done.exit_code == 0, done.output
        gen = run_dir / "generate"
        started = _marker(gen, "_STARTED")
        assert started and _marker(gen, "_SUCCESS") is None and (gen / "stage.log").is_file()  # unfinished
        assert len(_ids(run_dir)) == PILOT and Manifest.load(run_dir).get("generate.completions") is None
        events = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
        assert [e["stage"] for e in events if e["event"] == "stage_unfinished"] == ["generate"]
        for stage in ("tokenize", "train"):  # the scratch stages: finished, keyed, in the pilot's own folder
            success = _marker(run_dir / "pilot" / stage, "_SUCCESS")
            assert success and success["stage_key"] == _marker(run_dir / "pilot" / stage, "_STARTED")["stage_key"]
        assert Manifest.load(run_dir / "pilot").get("tokenize.dataset") is not None
        assert not (run_dir / "tokenize").exists() and not (run_dir / "train").exists()  # not the run's

        run = invoke("run", str(recipe), "--until", "generate", "--skip-preflight", "--continue-over-budget")
        assert run.exit_code == 0, run.output
    assert _marker(gen, "_SUCCESS")["stage_key"] == started["stage_key"]  # resumed under the same key
    assert not list(run_dir.glob("generate.superseded-*"))
    assert sorted(_ids(run_dir)) == sorted(set(_ids(run_dir))) and len(_ids(run_dir)) == PROMPTS


@pytest.mark.timeout(600)
def test_a_pilot_killed_mid_generation_and_mid_training_resumes_without_duplicates(tmp_path):
    with ScriptedOpenAIServer(Script(delay_s=0.3)) as server:
        recipe = tiny_file(tmp_path, stages__generate__backend="sglang", stages__generate__urls=[server.url],
                           stages__generate__concurrency=1, stages__generate__flush_every=1, pilot__train_steps=150,
                           budget__max_usd=None, budget__max_days=None)
        run_dir = tmp_path / "runs" / "tiny"
        _pilot_killed_when(recipe, lambda: 3 <= len(_ids(run_dir)) < PILOT)
        killed_at = len(_ids(run_dir))
        assert killed_at < PILOT and _marker(run_dir / "generate", "_SUCCESS") is None
        train = run_dir / "pilot" / "train"
        _pilot_killed_when(recipe, lambda: (train / "_STARTED").is_file() and (train / "stage.log").is_file())
        assert _marker(train, "_SUCCESS") is None and len(_ids(run_dir)) == PILOT
        tokenized = _marker(run_dir / "pilot" / "tokenize", "_SUCCESS")
        asked = len(server.requests)

        done = invoke("pilot", str(recipe), "--skip-preflight", "--continue-over-budget")
        assert done.exit_code == 0, done.output
    assert len(server.requests) == asked  # the generation was complete: nothing asked again
    assert _marker(run_dir / "pilot" / "tokenize", "_SUCCESS") == tokenized  # unchanged key: not re-run
    assert "resumes the interrupted attempt" in done.output  # train, in the same folder
    ids = _ids(run_dir)
    assert len(ids) == len(set(ids)) == PILOT
    assert (run_dir / "pilot" / "calibration.json").is_file() and _marker(train, "_SUCCESS") is not None
