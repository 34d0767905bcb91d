"""Run a recipe's stages in order, skipping finished ones and resuming the first unfinished one.

For each selected stage in `STAGE_ORDER`: compute its key (`dflashx.run.keys`); skip it when its
`_SUCCESS` holds that key (unless forced); move an outdated folder aside (its artifacts become
garbage); run `load_stage(name)(ctx)` through the one executor (`dflashx.run.executor`: its output
to `stage.log`, its metrics to records.jsonl + W&B and the observer); register the returned
artifacts in the manifest; write `provenance.json`, then `_SUCCESS` last. A failing stage stops the
run. Events go to records.jsonl (see `dflashx.track.records`), what a person watches to the
`RunObserver` the caller hands in (`dflashx.run.observer`; the CLI's is `dflashx.report.console`).
`_STARTED`/`_SUCCESS` keep `key_leaves` (`dflashx.run.keydiff`): a re-run says why. A stage that
stops at a limit of the recipe (`StageResult.unfinished`: generate's max_prompts / max_minutes, which
the pilot's plan sets) ends `unfinished`: nothing registered, no `_SUCCESS`, the next attempt resumes.
A run folder's recipe.yaml and plan.json say what the run is (`describe_run`: the session writes the run's
before its stages, the pilot its own in `pilot/`); each stage's provenance.json says what that stage ran under.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from dflashx.config.schema import Tier
from dflashx.plan.context import Estimates
from dflashx.plan.plan import Plan
from dflashx.resolve.model import ResolvedRecipe
from dflashx.run.executor import execute, stage_context
from dflashx.run.graph import Selection
from dflashx.run.keydiff import changed_keys, key_leaves, why_text
from dflashx.run.keys import StageKey, key_material, stage_key
from dflashx.run.observer import OK_STATES, RunObserver, SilentObserver, StageOutcome
from dflashx.run.rundir import RunDir, moved_line, set_aside
from dflashx.stages.base import StageContext, StageFailed, StageResult, load_stage
from dflashx.stages.graph import GRAPH
from dflashx.store.manifest import Manifest, atomic_write_json, atomic_write_text, utc_now
from dflashx.track.provenance import stage_provenance
from dflashx.track.records import RecordLog
from dflashx.track.redact import redact, redact_argv, redact_text
from dflashx.track.wandb_stage import stage_tracker


@dataclass
class _Attempt:
    """One stage attempt in progress: what provenance and the failure records need."""

    stage: str
    key: StageKey
    estimates: Estimates
    started_at: str = field(default_factory=utc_now)
    t0: float = field(default_factory=time.monotonic)

    @property
    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 3)


@dataclass
class RunResult:
    run_dir: Path
    run_id: str
    outcomes: list[StageOutcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.state in OK_STATES for o in self.outcomes)


class Orchestrator:
    """One `dflashx run` invocation over one run directory (holds its lock while running)."""

    def __init__(self, recipe: ResolvedRecipe, plan: Plan, run_dir: Path, argv: Sequence[str],
                 on_progress: Callable[[Path], object] | None = None, observer: RunObserver | None = None,
                 held: IO[str] | None = None):
        self.recipe = recipe
        self.held = held  # the run lock, when the caller holds it for more than this pipeline (a session)
        self.on_progress = on_progress  # rewrites PROGRESS.md (the CLI passes dflashx.report.progress)
        self.plan = plan
        self.resolved: dict[str, Any] = recipe.model_dump(mode="json")  # for provenance and W&B
        self.rundir = RunDir(Path(run_dir).resolve())
        self.argv = list(argv)
        self.observer = observer or SilentObserver()

    def run(self, selection: Selection) -> RunResult:
        run_id = self.rundir.ensure(self.recipe.name)
        lock = None if self.held else self.rundir.lock()
        try:
            self.records = RecordLog(self.rundir.path, run_id)
            result = RunResult(self.rundir.path, run_id)
            started = time.monotonic()
            self.records.append("run_start", argv=redact_argv(self.argv), pid=os.getpid(),
                                host=socket.gethostname(), stages=selection.stages)
            self.observer.run_started(self.rundir.path, selection.stages)
            try:
                for name in selection.stages:
                    outcome = self._stage(name, force=name in selection.force)
                    result.outcomes.append(outcome)
                    self.observer.stage_ended(outcome)
                    if outcome.state not in OK_STATES:
                        break
            finally:
                self.records.append("run_end", ok=result.ok, duration_s=round(time.monotonic() - started, 3))
                self._write_progress()
            return result
        finally:
            if lock is not None:
                lock.close()

    def _write_progress(self) -> None:
        """Regenerate PROGRESS.md from the records and manifest; a failure is only a warning."""
        if self.on_progress is None:
            return
        try:
            self.on_progress(self.rundir.path)
        except Exception as e:  # noqa: BLE001 - the summary file never fails a run
            self.records.append("warning", message=f"PROGRESS.md not written: {type(e).__name__}: {e}")

    # ------------------------------------------------------------------ one stage

    def _stage(self, name: str, force: bool) -> StageOutcome:
        if not getattr(self.recipe.stages, name).enabled:
            self.records.append("stage_skipped", stage=name, reason="disabled")
            return StageOutcome(name, "disabled")
        manifest = Manifest.load(self.rundir.path)
        key = stage_key(name, self.recipe, manifest)
        if key.missing:
            message = (f"stage {name} needs {', '.join(key.missing)}, which no finished stage has produced: "
                       f"run (or enable) {', '.join(sorted({m.split('.')[0] for m in key.missing}))} first")
            self.records.append("stage_failed", stage=name, stage_key=key.key, error="MissingInput", message=message)
            return self._fail(name, key.key, message)
        done = self.rundir.success(name)
        if done and done.get("stage_key") == key.key and not force:
            self.records.append("stage_skipped", stage=name, stage_key=key.key, reason="done")
            return StageOutcome(name, "skipped", key.key)
        try:
            fn = load_stage(name)
        except Exception as e:  # noqa: BLE001 - a stage module that fails to import is a crash
            return self._crashed(name, key.key, e)
        leaves = key_leaves(key_material(name, self.recipe, key.inputs))
        reason = self._reason(name, key.key, leaves, force)
        self._set_aside(name, key.key, manifest, forced=force)
        return self._execute(name, fn, key, leaves, reason)

    def _reason(self, name: str, key: str, leaves: dict[str, Any], forced: bool) -> str | None:
        """Why the stage runs: None the first time, else what changed since its last attempt here."""
        done = self.rundir.success(name)
        marker = done or self.rundir.started(name)
        if marker is None:
            return None
        if marker.get("stage_key") == key:
            return "re-runs: --force" if done and forced else "resumes the interrupted attempt"
        return why_text("re-runs" if done else "starts over", changed_keys(marker.get("key_leaves"), leaves))

    def _set_aside(self, name: str, key: str, manifest: Manifest, forced: bool) -> None:
        """Move an outdated (or forced) stage folder aside and mark its artifacts garbage."""
        moved = set_aside(self.rundir, name, key, manifest, forced)
        if moved:
            self.records.append("warning", stage=name, message=f"moved outdated {name}/ to {moved[1]}/ (garbage)")
            self.observer.message(moved_line(name, *moved))

    def _execute(self, name: str, fn: Callable[[StageContext], StageResult], key: StageKey,
                 leaves: dict[str, Any], reason: str | None) -> StageOutcome:
        out_dir = self.rundir.stage_dir(name)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.rundir.mark_started(name, key.key, leaves)
        manifest = Manifest.load(self.rundir.path)
        ctx = stage_context(name, self.recipe, self.plan, self.rundir.path, out_dir,
                            {n: self.rundir.path / manifest.entries[n].path for n in key.inputs})
        self.records.append("stage_start", stage=name, stage_key=key.key, pid=os.getpid(), host=socket.gethostname(),
                            reason=reason)
        self._write_progress()
        estimates = self.plan.stage(name).estimates
        attempt = _Attempt(name, key, estimates)
        tracker = stage_tracker(records=self.records, tracking=self.recipe.tracking, run_id=self.records.run_id,
                                stage=name, run_dir=self.rundir.path,
                                config={"recipe": self.resolved, "plan": estimates.to_json(),
                                        "stage_key": key.key})
        try:
            ran = execute(fn, ctx, label=name, key=key.key, reason=reason, estimate_s=estimates.seconds,
                          log=out_dir / "stage.log", observer=self.observer, tracker=tracker,
                          finish=lambda result: None if result.unfinished else register_outputs(
                              self.rundir.path, name, key, result, out_dir, self.recipe.storage.tiers,
                              estimates.usd),
                          warn=lambda message: self.records.append("warning", stage=name, message=message))
        except KeyboardInterrupt:
            self._write_provenance(attempt, "interrupted", {}, "interrupted by the user")
            self.records.append("stage_interrupted", stage=name, stage_key=key.key, duration_s=attempt.elapsed)
            raise
        if isinstance(ran.error, StageFailed):
            return self._failed(attempt, str(ran.error), "StageFailed", ran.error.metrics)
        if ran.error is not None:  # any crash stops the run with a saved traceback
            return self._failed(attempt, self._save_traceback(name, ran.error), type(ran.error).__name__, {})
        assert ran.result is not None
        outputs, metrics = ran.finished, redact(ran.result.metrics)
        duration = attempt.elapsed
        if ran.result.unfinished:  # stopped at the recipe's limit: _STARTED stays, the next attempt resumes
            self._write_provenance(attempt, "unfinished", {}, ran.result.unfinished)
            self.records.append("stage_unfinished", stage=name, stage_key=key.key, duration_s=duration,
                                metrics=metrics, message=ran.result.unfinished)
            return StageOutcome(name, "unfinished", key.key, ran.result.unfinished, duration, metrics)
        self._write_provenance(attempt, "done", {n: o["sha256"] for n, o in outputs.items()})
        self.rundir.mark_success(name, key.key, duration, leaves)
        self.records.append("stage_end", stage=name, stage_key=key.key, duration_s=duration,
                            metrics=metrics, outputs=outputs)
        return StageOutcome(name, "done", key.key, duration_s=duration, metrics=metrics)

    def _write_provenance(self, attempt: _Attempt, state: str, outputs: dict[str, Any],
                          message: str | None = None) -> None:
        atomic_write_json(self.rundir.stage_dir(attempt.stage) / "provenance.json", stage_provenance(
            stage=attempt.stage, stage_key=attempt.key.key, argv=self.argv, resolved=self.resolved,
            started_at=attempt.started_at, ended_at=utc_now(), exit_state=state, inputs=attempt.key.inputs,
            outputs=outputs, message=message, estimates=attempt.estimates.to_json()))

    def _failed(self, attempt: _Attempt, message: str, error: str, metrics: dict[str, Any]) -> StageOutcome:
        self._write_provenance(attempt, "failed", {}, message)
        self.records.append("stage_failed", stage=attempt.stage, stage_key=attempt.key.key, duration_s=attempt.elapsed,
                            error=error, message=redact_text(message), metrics=redact(metrics))
        return self._fail(attempt.stage, attempt.key.key, message, metrics, attempt.elapsed)

    def _save_traceback(self, name: str, exc: BaseException) -> str:
        """Write the (redacted) traceback to <stage>/error.log; return the one-line message."""
        log = self.rundir.stage_dir(name) / "error.log"
        atomic_write_text(log, redact_text("".join(traceback.format_exception(exc))))
        return f"{type(exc).__name__}: {exc} (traceback in {log})"

    def _crashed(self, name: str, key: str, exc: BaseException) -> StageOutcome:
        message = self._save_traceback(name, exc)
        self.records.append("stage_failed", stage=name, stage_key=key, error=type(exc).__name__,
                            message=redact_text(message))
        return self._fail(name, key, message)

    def _fail(self, name: str, key: str, message: str, metrics: dict[str, Any] | None = None,
              duration: float | None = None) -> StageOutcome:
        return StageOutcome(name, "failed", key, redact_text(message), duration, redact(metrics or {}))


def describe_run(run_dir: Path, plan: Plan) -> None:
    """The run folder's recipe.yaml (the plan's resolved recipe) and plan.json, redacted: what `dflashx status`,
    the reports and inventory read of the run (module doc)."""
    assert plan.resolved is not None, "a run is described by a resolved plan"
    rundir = RunDir(Path(run_dir).resolve())
    rundir.path.mkdir(parents=True, exist_ok=True)
    rundir.save_recipe(redact(plan.resolved.model_dump(mode="json")))
    rundir.save_plan(redact(plan.to_json()))


def run_pipeline(recipe: ResolvedRecipe, plan: Plan, run_dir: Path, selection: Selection,
                 argv: Sequence[str] = (), on_progress: Callable[[Path], object] | None = None,
                 observer: RunObserver | None = None, held: IO[str] | None = None) -> RunResult:
    """Run the selected stages of `recipe` in `run_dir` (see the module docstring); `on_progress`
    is called with the run folder as each stage starts and when the run ends (PROGRESS.md);
    `observer` (default: none) sees the run as it goes; `held`: the run lock the caller already
    holds (a session's pilot and stages, the pilot's stages in `pilot/`), else this call takes it."""
    return Orchestrator(recipe, plan, run_dir, argv, on_progress, observer, held).run(selection)


def register_outputs(run_dir: Path, name: str, key: StageKey, result: StageResult, out_dir: Path,
                     tiers: Mapping[str, Tier], cost_usd: float) -> dict[str, dict[str, Any]]:
    """Register stage `name`'s artifacts in the run's manifest (tiers from the recipe's overrides `tiers`; a
    replaceable one carries the stage's planned `cost_usd`) and save it: what the orchestrator does when a stage
    ends, inside its timer (`benchmarks/fixed_costs.py` times it as part of a stage's bookkeeping)."""
    manifest = Manifest.load(run_dir)  # a stage (backup) may have saved it meanwhile
    undeclared = sorted(set(result.artifacts) - set(GRAPH[name].outputs))
    if undeclared:
        raise RuntimeError(f"stage {name} returned artifacts {undeclared} that dflashx.stages.graph does not "
                           f"declare (it declares {list(GRAPH[name].outputs)})")
    outputs = {}
    for artifact_name, artifact in result.artifacts.items():
        path = (out_dir / artifact.path).resolve()
        if not path.exists() or out_dir.resolve() not in (path, *path.parents):
            raise RuntimeError(f"stage {name} returned artifact {artifact_name!r} at {artifact.path!r}, "
                               f"which is not an existing path inside {out_dir}")
        tier = tiers.get(f"{name}.{artifact_name}", artifact.tier)
        entry = manifest.register(name, artifact_name, path, tier, inputs=list(key.inputs),
                                  regen_cost_usd=cost_usd if tier == "replaceable" else None,
                                  stage_key=key.key, description=artifact.description)
        outputs[artifact_name] = {"path": entry.path, "size": entry.size, "sha256": entry.sha256, "tier": tier}
    manifest.save()
    return outputs
