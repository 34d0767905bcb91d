"""The one stage executor: how every stage is run (the pilot's too: it runs the orchestrator).

`stage_context(...)` builds a stage's `StageContext` (the only place one is built). `execute(...)`
tells the observer the stage started, sends everything the stage prints to its log file
(`dflashx.track.output.captured`: `<stage>/stage.log`), sends each `ctx.log` to the tracker
(records.jsonl and W&B) and then to the observer, runs the stage, then `finish(result)` inside the same capture
(the orchestrator registers the artifacts there), and returns what happened: the result, or the
exception that stopped it. KeyboardInterrupt is not caught: the caller records the interruption
and lets it go on. While the stage runs, `$DFLASHX_STAGE_DIR` names its folder (what it waits on
is written there: `dflashx.track.waiting`) and a `Watchdog` (`dflashx.run.watchdog`) says what it
waits on once it has run several times its planned time with no progress. The orchestrator
(`dflashx.run.orchestrator`) adds what a run keeps around an attempt: markers, records, provenance,
the manifest.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dflashx.plan.plan import Plan
from dflashx.resolve.model import ResolvedRecipe
from dflashx.run.observer import RunObserver
from dflashx.run.watchdog import Watchdog
from dflashx.stages.base import StageContext, StageResult
from dflashx.track.output import captured
from dflashx.track.waiting import STAGE_DIR_ENV


class Tracker(Protocol):
    """Where a run's stage metrics go besides the observer (`dflashx.track.wandb_stage.StageTracker`)."""

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None: ...
    def summary(self, metrics: dict[str, Any]) -> None: ...


@dataclass
class Executed:
    """One stage attempt's end: `result` (and what `finish` returned) or the `error` that stopped it."""

    seconds: float
    result: StageResult | None = None
    finished: Any = None
    error: Exception | None = None


def stage_context(name: str, recipe: ResolvedRecipe, plan: Plan, run_dir: Path, out_dir: Path,
                  inputs: dict[str, Path]) -> StageContext[Any]:
    """The context stage `name` runs in: the resolved recipe, what the plan decided for it (its typed
    `StagePlan`), its folder and its inputs' paths."""
    return StageContext(name=name, recipe=recipe, runtime=plan.stage(name), run_dir=run_dir, out_dir=out_dir,
                        inputs=inputs)


def _metric_logger(label: str, tracker: Tracker | None, observer: RunObserver,
                   warn: Callable[[str], object], progressed: Callable[[], None]) -> Callable[..., None]:
    """`ctx.log`: the tracker, then the observer (a failure there: one warning, then silence)."""
    quiet = False

    def log(metrics: dict[str, Any], step: int | None = None) -> None:
        nonlocal quiet
        progressed()
        if tracker is not None:
            tracker.log(metrics, step)
        if quiet:
            return
        try:
            observer.stage_metrics(label, metrics, step)
        except Exception as e:  # noqa: BLE001 - the view never stops a stage
            quiet = True
            warn(f"progress display failed: {type(e).__name__}: {e}")

    return log


@contextmanager
def _stage_dir_env(out_dir: Path) -> Iterator[None]:
    """`$DFLASHX_STAGE_DIR` is the stage's folder while it runs (`dflashx.track.waiting` writes there)."""
    before = os.environ.get(STAGE_DIR_ENV)
    os.environ[STAGE_DIR_ENV] = str(Path(out_dir).resolve())
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(STAGE_DIR_ENV, None)
        else:
            os.environ[STAGE_DIR_ENV] = before


def execute(call: Callable[[StageContext], StageResult], ctx: StageContext, *, label: str, key: str,
            reason: str | None, estimate_s: float | None, log: Path, observer: RunObserver,
            tracker: AbstractContextManager[Tracker] | None = None,
            finish: Callable[[StageResult], Any] | None = None,
            warn: Callable[[str], object] = lambda _message: None) -> Executed:
    """Run `call(ctx)` as stage `label` (see the module docstring); `warn` gets what goes wrong
    around the stage without stopping it."""
    observer.stage_started(label, key, reason, estimate_s)
    t0 = time.monotonic()
    try:
        with captured(log), (tracker or nullcontext()) as track, _stage_dir_env(ctx.out_dir), \
                Watchdog(label, ctx.out_dir, estimate_s, observer.message) as watchdog:
            ctx.log = _metric_logger(label, track, observer, warn, watchdog.progressed)
            result = call(ctx)
            finished = finish(result) if finish else None
            if track is not None:
                track.summary(result.metrics)
    except Exception as e:  # noqa: BLE001 - the caller decides what a failed attempt leaves behind
        return Executed(time.monotonic() - t0, error=e)
    return Executed(time.monotonic() - t0, result, finished)
