"""What `dflashx run` shows: stamped plain lines off a terminal, the summary and next commands, why
a stage re-runs, live progress on a terminal, and third-party noise kept in the stage log."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import test_run_fakes as fakes
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from dflashx.cli._common import make_console
from dflashx.cli.main import app
from dflashx.report import console as console_module
from dflashx.report.console import PLAIN_EVERY_S, RunConsole
from dflashx.run import orchestrator
from dflashx.run.keydiff import changed_keys, key_leaves
from dflashx.run.observer import StageOutcome
from dflashx.stages.base import Artifact, StageResult

TESTS = Path(__file__).resolve().parent
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # anything but \t and \n: ANSI escapes, \r, ...
NOISE = ("NOISE-print", "NOISE-stderr", "NOISE-fd1", "NOISE-fd2", "NOISE-warn", "NOISE-deepspeed", "NOISE-child")


def qc_with_plots(ctx):
    fakes.qc(ctx)
    for name in ("report.md", "length.png", "mask.png"):
        (ctx.out_dir / "report" / name).write_text("x")
    return StageResult({"report": Artifact("report")}, {"passed": True, "samples": 4})


def eval_with_plot(ctx):
    result = fakes.evaluate(ctx)
    (ctx.out_dir / "report" / "acceptance.png").write_text("x")
    return StageResult(result.artifacts, {"tau": 2.5, "tau_untrained": 1.1})


def noisy_ingest(ctx):
    """Everything a third-party library does to a terminal, from Python and below it."""
    print("NOISE-print")
    print("NOISE-stderr", file=sys.stderr)
    os.write(1, b"NOISE-fd1\n")
    os.write(2, b"NOISE-fd2\n")
    warnings.warn("NOISE-warn", stacklevel=1)
    logging.getLogger("DeepSpeed").warning("NOISE-deepspeed")
    subprocess.run([sys.executable, "-c", "print('NOISE-child')"], check=True)
    logging.getLogger("dflashx.stages.ingest").warning("a dflashx warning stays visible")
    return fakes.ingest(ctx)


@pytest.fixture(autouse=True)
def fake_stages(monkeypatch):
    stages = {**fakes.FAKES, "qc": qc_with_plots, "eval": eval_with_plot}
    monkeypatch.setattr(orchestrator, "load_stage", stages.__getitem__)
    monkeypatch.setattr(logging.getLogger("dflashx"), "handlers", [])
    fakes.CALLS.clear()


@pytest.fixture
def recipe(tmp_path):
    source = fakes.write_prompts(tmp_path / "prompts.jsonl")
    return fakes.write_recipe(tmp_path / "recipe.yaml", source, name="console-test")


def _run(*args: str):
    result = CliRunner().invoke(app, ["run", *args])
    assert result.exit_code == 0, result.output
    return result.output


def _row(output: str, stage: str) -> str:
    return next(line for line in output.splitlines() if re.match(rf"^│ {stage}\s+│", line))


def test_plain_output_is_stamped_lines_then_the_summary_and_next_commands(tmp_path, recipe):
    run_dir = tmp_path / "run"
    output = _run(str(recipe), "--run-dir", str(run_dir))
    assert not CONTROL.search(output), repr(CONTROL.search(output))
    assert re.match(r"^\d\d:\d\d:\d\d dflashx run .*: planning…$", output.splitlines()[0])
    started = re.findall(r"^\d\d:\d\d:\d\d > (\w+): running \(key \w{12}\)$", output, re.M)
    assert started == ["ingest", "generate", "qc", "tokenize", "train", "eval", "export"]
    assert re.search(r"^\d\d:\d\d:\d\d \+ export: done in ", output, re.M)
    assert re.search(r"^\d\d:\d\d:\d\d - backup: disabled", output, re.M)
    for stage in ("ingest", "generate", "qc", "tokenize", "train", "eval", "export"):
        assert "│ done " in _row(output, stage)
    assert "│ disabled " in _row(output, "backup")
    assert "τ 2.50 trained · vs 1.10 untrained" in _row(output, "eval")
    shown = run_dir.resolve()
    for path in ("qc/report/report.md", "qc/report/qc.json", "qc/report/*.png (2 plots)", "eval/report/eval.json",
                 "eval/report/acceptance.png", "export/drafter/", "train/checkpoint/"):
        assert f"{shown}/{path}" in output, path
    nxt = output[output.index("Next:"):]
    assert f"dflashx status {shown}" in nxt and f"dflashx inventory {shown}" in nxt
    assert f"train.lr=0.0006 --run-dir {run_dir}" in nxt and f"dflashx compare {shown}" in nxt
    assert f"less {shown}/qc/report/report.md" in nxt


def test_warm_run_skips_everything_and_a_changed_lr_says_why(tmp_path, recipe):
    run_dir = tmp_path / "run"
    _run(str(recipe), "--run-dir", str(run_dir))
    fakes.CALLS.clear()
    warm = _run(str(recipe), "--run-dir", str(run_dir))
    assert not fakes.CALLS and warm.count("unchanged (skipped)") == 7
    assert "0 stage(s) ran, 7 unchanged" in warm and "earlier" in _row(warm, "train")
    changed = _run(str(recipe), "train.lr=1e-4", "--run-dir", str(run_dir))
    assert dict(fakes.CALLS) == {"train": 1, "eval": 1, "export": 1}
    # the recipe's lr and the Muon rate derived from it (muon_lr = 10 x lr when unset) both changed
    assert re.search(r"> train: running \(key \w{12}; re-runs: stages\.train\.lr, stages\.train\.muon_lr changed\)",
                     changed)
    for stage in ("eval", "export"):
        assert re.search(rf"> {stage}: running \(key \w{{12}}; re-runs: input train\.checkpoint changed\)", changed)
    assert changed.count("unchanged (skipped)") == 4
    assert "│ unchanged " in _row(changed, "ingest") and "│ done " in _row(changed, "train")


def test_changed_keys_names_leaves_inputs_and_old_markers():
    def material(lr, sha, sources):
        return {"version": 2, "stage": "train", "inputs": {"tokenize.dataset": sha},
                "config": {"stages.train": {"lr": lr, "epochs": 1}, "dataset": {"sources": sources},
                           "target": {"model": {"fingerprint": sha}}}}

    old = key_leaves(material(1e-3, "a" * 64, [{"path": "a"}]))
    assert changed_keys(old, key_leaves(material(1e-3, "a" * 64, [{"path": "a"}]))) == []
    assert changed_keys(old, key_leaves(material(1e-4, "b" * 64, [{"path": "b"}]))) == [
        "stages.train.lr", "dataset.sources[0].path", "target.model", "input tokenize.dataset"]
    assert changed_keys(None, old) is None and changed_keys({"stage_key": "x"}, old) is None
    assert changed_keys({**old, "version": 1}, old) == ["the stage key version (dflashx changed what keys hash)"]
    assert "a" * 16 not in str(old)  # values are digested, never stored


def test_python_level_noise_goes_to_the_stage_log_under_clirunner(tmp_path, recipe, monkeypatch):
    """Without real fds (CliRunner) print, warnings and third-party loggers are still kept off the view."""
    monkeypatch.setitem(fakes.FAKES, "ingest", noisy_ingest)
    monkeypatch.setattr(orchestrator, "load_stage", fakes.FAKES.__getitem__)
    run_dir = tmp_path / "run"
    output = _run(str(recipe), "--run-dir", str(run_dir), "--until", "ingest")
    log = (run_dir / "ingest" / "stage.log").read_text()
    for noise in ("NOISE-print", "NOISE-stderr", "NOISE-warn", "NOISE-deepspeed"):
        assert noise in log and noise not in output, noise
    assert "WARNING dflashx.stages.ingest: a dflashx warning stays visible" in output
    assert "a dflashx warning stays visible" in log


CHILD = f"""
import logging, sys
sys.path.insert(0, {str(TESTS)!r})
import dflashx.run.orchestrator as orchestrator
import test_run_fakes as fakes
import test_run_console as here
logging.getLogger("DeepSpeed").addHandler(logging.StreamHandler(sys.stdout))  # as DeepSpeed's import does
logging.getLogger("DeepSpeed").propagate = False
orchestrator.load_stage = {{**fakes.FAKES, "ingest": here.noisy_ingest, "qc": here.qc_with_plots}}.__getitem__
from dflashx.cli.main import app
sys.argv = ["dflashx", "run", *sys.argv[1:]]
app()
"""


def test_fd_level_noise_goes_to_the_stage_log_in_a_real_process(tmp_path, recipe):
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", CHILD, str(recipe), "--run-dir", str(run_dir), "--until", "qc"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "80"})
    terminal = done.stdout + done.stderr
    assert done.returncode == 0, terminal
    log = (run_dir / "ingest" / "stage.log").read_text()
    for noise in NOISE:
        assert noise in log, noise
        assert noise not in terminal, noise
    assert "WARNING dflashx.stages.ingest: a dflashx warning stays visible" in terminal
    assert not CONTROL.search(terminal)
    assert re.search(r"^\d\d:\d\d:\d\d \+ qc: done in ", done.stdout, re.M)
    assert f"{run_dir.resolve()}/qc/report/*.png (2 plots)" in done.stdout  # not cut to COLUMNS=80


def test_tty_progress_shows_step_of_total_eta_and_figures():
    buf = io.StringIO()
    t = [1000.0]
    view = RunConsole(Console(file=buf, force_terminal=True, width=140), clock_fn=lambda: t[0])
    view.stage_started("train", "ab" * 32, "re-runs: stages.train.lr changed", 120.0)
    for step in (10, 20, 40):
        t[0] += 5.0
        view.stage_metrics("train", {"step": step, "total_steps": 300, "loss": 2.31, "tokens_per_s": 1234.5,
                                     "mfu": 0.031, "lr": 1e-3}, step)
    view.progress.refresh()
    drawn = buf.getvalue()
    assert "\x1b[" in drawn and "40/300 steps" in drawn and "loss 2.310 · 1,234 tok/s · MFU 3.1%" in drawn
    assert "ETA 1m27s" in drawn  # 30 steps in 10 s, 260 to go
    view.stage_ended(StageOutcome("train", "done", "ab" * 32, duration_s=15.0))
    assert view.progress is None and "+ train: done in 15.0s" in buf.getvalue()


def test_plain_progress_lines_are_rate_limited():
    buf = io.StringIO()
    t = [0.0]
    view = RunConsole(Console(file=buf, force_terminal=False), clock_fn=lambda: t[0])
    view.stage_started("generate", "cd" * 32, None, None)
    for i in range(1, 61):  # a metric every second for a minute
        t[0] = float(i)
        view.stage_metrics("generate", {"completions_total": i, "prompts_total": 120, "output_tokens_per_s": 50.0}, i)
    progress = [line for line in buf.getvalue().splitlines() if "generate: " in line and "completions" in line]
    assert len(progress) == 60 // PLAIN_EVERY_S
    assert re.match(r"^\d\d:\d\d:\d\d   generate: 10/120 completions · ETA 1m50s · 50 tok/s$", progress[0])
    assert not CONTROL.search(buf.getvalue())


def test_a_silent_stage_still_gets_a_line_off_a_terminal(monkeypatch):
    monkeypatch.setattr(console_module, "PLAIN_EVERY_S", 0.01)  # the ticker's period, not the clock's
    buf = io.StringIO()
    t = [0.0]
    view = RunConsole(Console(file=buf, force_terminal=False), clock_fn=lambda: t[0])
    view.stage_started("tokenize", "ef" * 32, None, 90.0)
    t[0] = 61.0
    deadline = time.monotonic() + 20
    while "running 1m01s" not in buf.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    view.close()
    assert re.search(r"^\d\d:\d\d:\d\d   tokenize: running 1m01s · plan ~1.5 min$", buf.getvalue(), re.M)


def test_make_console_off_a_terminal_keeps_whole_cells():
    buf = io.StringIO()
    table = Table("artifact", "where", "size")
    table.add_row("tokenize.dataset", "/tmp/" + "very-long-folder/" * 12 + "dataset", "16.0 KiB")
    make_console(file=buf).print(table)
    assert "16.0 KiB" in buf.getvalue() and "very-long-folder/" * 12 in buf.getvalue()
    assert not CONTROL.search(buf.getvalue())


def test_the_summary_shows_an_unfinished_stage_with_its_time_and_where_it_stopped(tmp_path, monkeypatch):
    def stops_at_its_limit(ctx):
        fakes.generate(ctx)
        return StageResult({"completions": Artifact("completions")}, {"completions_total": 6},
                           unfinished="6 of 10 prompts completed (stages.generate.max_prompts / max_minutes)")

    monkeypatch.setattr(orchestrator, "load_stage", {**fakes.FAKES, "generate": stops_at_its_limit}.__getitem__)
    result = fakes.run(fakes.make_recipe(fakes.write_prompts(tmp_path / "p.jsonl")), tmp_path / "run")
    buf = io.StringIO()
    view = RunConsole(Console(file=buf, width=300))
    view.console.print(view.table(result))
    row = _row(buf.getvalue(), "generate")
    assert re.search(r"│ unfinished\s+│ \d", row) and "earlier" not in row
    assert "6 of 10 prompts completed" in row
