"""The one stage executor (`dflashx.run.executor`) the run's stages and the pilot's scratch stages go
through: what the observer, the tracker and the log file get, and what a failure leaves."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import test_run_fakes as fakes

from dflashx.report.lines import EchoObserver
from dflashx.run.executor import execute, stage_context
from dflashx.stages.base import StageContext, StageResult


class Tracker:
    def __init__(self) -> None:
        self.logged: list[tuple[dict[str, Any], int | None]] = []
        self.summaries: list[dict[str, Any]] = []

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        self.logged.append((metrics, step))

    def summary(self, metrics: dict[str, Any]) -> None:
        self.summaries.append(metrics)


class Watcher(EchoObserver):
    def __init__(self, fail_on_metrics: bool = False) -> None:
        self.lines: list[str] = []
        super().__init__(self.lines.append)
        self.metrics: list[tuple[str, dict[str, Any]]] = []
        self.fail_on_metrics = fail_on_metrics

    def stage_metrics(self, name: str, metrics: dict[str, Any], step: int | None) -> None:
        if self.fail_on_metrics:
            raise RuntimeError("terminal gone")
        self.metrics.append((name, metrics))


def _ctx(tmp_path: Path, name: str = "ingest") -> StageContext:
    recipe = fakes.resolved(fakes.make_recipe(fakes.write_prompts(tmp_path / "p.jsonl")))
    return stage_context(name, recipe, fakes.make_plan(recipe), tmp_path, tmp_path / name, {})


def _stage(ctx: StageContext) -> StageResult:
    print("noise from a library")
    ctx.log({"step": 1}, step=1)
    ctx.log({"step": 2}, step=2)
    return StageResult(metrics={"done": True})


def test_a_stage_runs_with_its_output_in_the_log_and_its_metrics_to_tracker_then_observer(tmp_path):
    tracker, watcher, log = Tracker(), Watcher(), tmp_path / "pilot" / "ingest.log"
    ran = execute(_stage, _ctx(tmp_path), label="pilot ingest", key="-", reason="why", estimate_s=None, log=log,
                  observer=watcher, tracker=_entered(tracker), finish=lambda result: sorted(result.metrics))
    assert ran.error is None and ran.result is not None and ran.finished == ["done"] and ran.seconds >= 0
    assert watcher.lines == ["> pilot ingest: running (key -; why)"]
    assert [m for m, _ in tracker.logged] == [{"step": 1}, {"step": 2}] and tracker.summaries == [{"done": True}]
    assert watcher.metrics == [("pilot ingest", {"step": 1}), ("pilot ingest", {"step": 2})]
    assert "noise from a library" in log.read_text()


def test_a_failing_view_warns_once_and_the_tracker_still_gets_every_metric(tmp_path):
    tracker, warnings = Tracker(), []
    ran = execute(_stage, _ctx(tmp_path), label="ingest", key="k", reason=None, estimate_s=1.0, log=tmp_path / "l.log",
                  observer=Watcher(fail_on_metrics=True), tracker=_entered(tracker), warn=warnings.append)
    assert ran.error is None and len(tracker.logged) == 2
    assert warnings == ["progress display failed: RuntimeError: terminal gone"]


def test_a_crash_is_returned_not_raised_and_finish_never_runs(tmp_path):
    finished = []

    def crash(ctx: StageContext) -> StageResult:
        raise ValueError("bad record")

    ran = execute(crash, _ctx(tmp_path), label="ingest", key="k", reason=None, estimate_s=None,
                  log=tmp_path / "l.log", observer=Watcher(), finish=finished.append)
    assert isinstance(ran.error, ValueError) and ran.result is None and not finished


def test_an_interrupt_goes_on_to_the_caller(tmp_path):
    def interrupted(ctx: StageContext) -> StageResult:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        execute(interrupted, _ctx(tmp_path), label="ingest", key="k", reason=None, estimate_s=None,
                log=tmp_path / "l.log", observer=Watcher())


def test_stage_context_is_the_stage_s_section_of_the_recipe(tmp_path):
    ctx = _ctx(tmp_path, "train")
    assert ctx.name == "train" and ctx.config is ctx.recipe.stages.train
    assert ctx.out_dir == tmp_path / "train" and ctx.run_dir == tmp_path and ctx.inputs == {}


@contextmanager
def _entered(tracker: Tracker):
    yield tracker
