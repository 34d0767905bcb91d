"""`dflashx pilot`: measure what the plan assumed on a few hundred prompts, before the big spend.

One entry point, `run_pilot`, reusing the real stages:
  1. ingest   the run's own ingest stage (`run_pipeline --until ingest`): the real prompt count;
  2. generate the run's generate stage on the first `pilot.prompts` ingested prompts not yet
              completed (those in flight finish after `pilot.max_minutes`), writing into the run's
              `generate/` folder under the generate stage's key with `_STARTED` and no `_SUCCESS`:
              the full generation resumes after them and never asks for a prompt twice (a changed
              generation key moves the folder aside, as for any interrupted attempt);
  3. tokenize and train  the real stages on those completions in `pilot/` (not artifacts of the
              run), `pilot.train_steps` optimizer steps; the DeepSpeed states are deleted after;
  Steps 2 and 3 run through the run's own stage executor (`dflashx.run.executor`), their output in
  `pilot/<stage>.log`, with no `_SUCCESS`, records or manifest entries;
  4. measure  lengths of every completion present (a histogram, truncation, the standard error of
              the mean by source), generation tokens/s against the planner's prediction for the
              pilot's own conditions (`serving_ratio`; with the MTP head, predicted at the accepted length
              the servers reported, which is itself calibrated), the trainer's MFU, tokens/s and step time;
  5. write    `pilot/calibration.json` (`PilotCalibration`), which `dflashx plan` of the same
              recipe applies, and re-plan with it.
The prediction for the pilot's generation: its completions all start at once per server and drain,
so a server's mean batch is (its output tokens) / (its longest completion), not the steady batch:
the plan is made for that batch (`stages.generate.concurrency`) with the measured lengths and
without any earlier serving calibration. The transformers backend batches the same way in the pilot
as in the full run, so its prediction needs no such change.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflashx.config.schema import Recipe
from dflashx.data.jsonl import iter_jsonl, iter_shards, write_jsonl_atomic
from dflashx.plan.calibration import (
    PilotCalibration, conditions, predicted, predicted_tokens_per_s, with_mtp_accept_length,
)
from dflashx.plan.plan import Plan, make_plan
from dflashx.resolve.model import ResolvedRecipe
from dflashx.run.executor import execute, stage_context
from dflashx.run.graph import select
from dflashx.run.keydiff import key_leaves
from dflashx.run.keys import key_material, stage_key
from dflashx.run.layout import PILOT_DIR, calibration_path
from dflashx.run.observer import RunObserver, StageOutcome
from dflashx.run.orchestrator import run_pipeline
from dflashx.run.pilot_measure import length_stats, slim, source_weights, training_stats
from dflashx.run.rundir import RunDir, moved_line, set_aside
from dflashx.stages.base import StageContext, StageResult, load_stage
from dflashx.store.manifest import Manifest, atomic_write_json, utc_now
from dflashx.targets.registry import TargetFacts


class PilotFailed(RuntimeError):
    """A pilot step failed; the message says which and where its log is."""


@dataclass
class PilotOutcome:
    calibration: PilotCalibration
    path: Path  # calibration.json
    before: Plan  # the plan without the pilot's figures
    after: Plan  # the plan with them
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per pilot step


def _until(items: Iterable[dict[str, Any]], minutes: float | None) -> Iterator[dict[str, Any]]:
    """The items, until `minutes` have passed since the first was taken (the backend pulls lazily)."""
    deadline = None
    for item in items:
        now = time.monotonic()
        deadline = deadline or (now + minutes * 60 if minutes else math.inf)
        if now > deadline:
            return
        yield item


def _ids(folder: Path) -> set[str]:
    return {r["id"] for r in iter_shards(folder)} if folder.is_dir() else set()


class Pilot:
    """One pilot in one run directory (holds the run lock from the generation on)."""

    def __init__(self, recipe: Recipe, facts: TargetFacts | None, run_dir: Path, observer: RunObserver,
                 argv: Iterable[str] = ()):
        self.recipe, self.facts, self.observer, self.argv = recipe, facts, observer, list(argv)
        if not (recipe.stages.ingest.enabled and recipe.stages.generate.enabled):
            raise PilotFailed("stages.ingest and stages.generate must be enabled: the pilot measures their output")
        self.before = make_plan(recipe, facts)
        if self.before.resolved is None or self.before.errors:
            raise PilotFailed(f"the plan has {len(self.before.errors)} error(s): fix them first (`dflashx plan`)")
        self.resolved: ResolvedRecipe = self.before.resolved
        self.plan = self.before.to_json()
        self.rundir = RunDir(Path(run_dir).resolve())
        self.dir = self.rundir.path / PILOT_DIR
        self.seconds: dict[str, float] = {}

    # ------------------------------------------------------------------ steps

    def run(self) -> PilotOutcome:
        t0 = time.monotonic()
        result = run_pipeline(self.resolved, self.plan, self.rundir.path, select(until="ingest"), self.argv,
                              observer=self.observer)
        if not result.ok:
            raise PilotFailed(f"ingest failed: {result.outcomes[-1].message}")
        self.seconds["ingest"] = time.monotonic() - t0
        lock = self.rundir.lock()
        try:
            cal = self._measure()
            self.seconds["total"] = time.monotonic() - t0
            path = self._save(cal)
        finally:
            lock.close()
        return PilotOutcome(cal, path, self.before, make_plan(self.recipe, self.facts, cal), self.seconds)

    def _save(self, cal: PilotCalibration) -> Path:
        """calibration.json, registered in the manifest (inventory and backup see it) as `pilot.calibration`."""
        path = calibration_path(self.rundir.path)
        atomic_write_json(path, cal.model_dump(mode="json"))
        manifest = Manifest.load(self.rundir.path)
        manifest.register(PILOT_DIR, "calibration", path, "replaceable",
                          description="what `dflashx pilot` measured; `dflashx plan` applies it")
        manifest.save()
        return path

    def _measure(self) -> PilotCalibration:
        manifest = Manifest.load(self.rundir.path)
        prompts = self.rundir.path / manifest.entries["ingest.prompts"].path
        weights, samples, prompt_bytes = source_weights(iter_shards(prompts))
        generated = self._generate(manifest, prompts)
        completions = self.rundir.stage_dir("generate") / "completions"
        records = [slim(r) for r in iter_shards(completions)] if completions.is_dir() else []
        if not records:
            raise PilotFailed("no completion to measure: the pilot generated none")
        train = self.resolved.stages.train
        stats, lengths = length_stats(records, weights, self.resolved.stages.generate.max_tokens, train.max_length)
        stats |= {"samples": samples, "prompt_bytes_mean": prompt_bytes}
        trained = None
        if self.recipe.stages.tokenize.enabled and train.enabled:
            trained = self._train(completions, [r["id"] for r in records[: self.recipe.pilot.prompts]], stats)
        serving = self._serving_ratio(generated, stats, records)
        measured = {"lengths": lengths, "generation": serving, "training": trained, "samples": samples,
                    "seconds": self.seconds}
        return PilotCalibration(
            run_id=(self.rundir.info() or {}).get("run_id", self.rundir.path.name), run_dir=str(self.rundir.path),
            measured_at=utc_now(), conditions=conditions(self.recipe), stats=stats,
            serving_ratio=serving.get("ratio"), serving_ratio_rse=serving.get("ratio_rse"),
            mtp_accept_length=serving.get("mtp_accept_length"),
            training_mfu=min(trained["mfu"], 1.0) if trained else None,
            training_mfu_rse=trained.get("mfu_rse") if trained else None, measured=measured)

    def _stage(self, name: str, ctx: StageContext, call: Any, key: str, what: str) -> StageResult:
        """Run one real stage's function through the executor, its output in pilot/<name>.log; any
        failure stops the pilot with where to look."""
        label, log = f"pilot {name}", self.dir / f"{name}.log"
        ran = execute(call, ctx, label=label, key=key, reason=what, estimate_s=None, log=log, observer=self.observer)
        if ran.error is not None:
            e = ran.error
            self.observer.stage_ended(StageOutcome(label, "failed", message=f"{type(e).__name__}: {e}"))
            raise PilotFailed(f"pilot {name} failed: {e} (log: {log})") from e
        assert ran.result is not None
        self.seconds[name] = ran.seconds
        self.observer.stage_ended(StageOutcome(label, "done", duration_s=ran.seconds))
        return ran.result

    def _generate(self, manifest: Manifest, prompts: Path) -> dict[str, Any] | None:
        """Complete the first `pilot.prompts` prompts not done yet into the run's generate/ (see above)."""
        key = stage_key("generate", self.resolved, manifest)
        done = self.rundir.success("generate")
        if done and done.get("stage_key") == key.key:
            self.observer.message("= pilot generate: the run's generation is finished; measuring its completions")
            return None
        moved = set_aside(self.rundir, "generate", key.key, manifest)
        if moved:
            self.observer.message(moved_line("generate", *moved))
        out = self.rundir.stage_dir("generate")
        have = _ids(out / "completions")
        todo = [p for p in iter_shards(prompts) if p["id"] not in have][: self.recipe.pilot.prompts]
        if not todo:
            return None
        write_jsonl_atomic(self.dir / "prompts" / "shard-00000.jsonl", todo)
        out.mkdir(parents=True, exist_ok=True)
        self.rundir.mark_started("generate", key.key, key_leaves(key_material("generate", self.resolved, key.inputs)))
        ctx = stage_context("generate", self.resolved, self.plan, self.rundir.path, out,
                            {"ingest.prompts": self.dir / "prompts"})
        from dflashx.stages.generate import generate

        minutes = self.recipe.pilot.max_minutes
        result = self._stage("generate", ctx, lambda c: generate(c, _until(todo, minutes), len(todo)), key.key,
                             f"the first {len(todo)} prompts, kept for the full generation")
        return result.metrics | {"ids": {p["id"] for p in todo} & _ids(out / "completions")}

    def _train(self, completions: Path, ids: list[str], stats: dict[str, Any]) -> dict[str, Any] | None:
        """Tokenize and train on `ids` with the real stages in pilot/; the trainer's windows."""
        for scratch in ("completions", "tokenize", "train"):
            shutil.rmtree(self.dir / scratch, ignore_errors=True)
        wanted = set(ids)
        write_jsonl_atomic(self.dir / "completions" / "shard-00000.jsonl",
                           (r for r in iter_shards(completions) if r["id"] in wanted))
        tok = stage_context("tokenize", self.resolved, self.plan, self.rundir.path, self.dir / "tokenize",
                            {"generate.completions": self.dir / "completions"})
        tokenized = self._stage("tokenize", tok, load_stage("tokenize"), "-",
                                f"{len(ids)} completions into {PILOT_DIR}/")
        train = self.resolved.stages.train
        steps = self.recipe.pilot.train_steps
        rows = max(int(tokenized.metrics.get("samples") or len(ids)), 1)
        short = train.model_copy(update={
            "max_steps": steps, "epochs": max(train.epochs, math.ceil(steps * train.global_batch / rows) + 1),
            "log_every": max(1, steps // 20), "checkpoint_every": steps, "keep_checkpoints": 1})
        recipe = self.resolved.model_copy(update={"stages": self.resolved.stages.model_copy(update={"train": short})})
        ctx = stage_context("train", recipe, self.plan, self.rundir.path, self.dir / "train",
                            {"tokenize.dataset": self.dir / "tokenize" / "dataset"})
        self._stage("train", ctx, load_stage("train"), "-", f"{steps} steps to measure MFU and tokens/s")
        metrics = self.dir / "train" / "logs" / "metrics.jsonl"
        windows = list(iter_jsonl(metrics)) if metrics.is_file() else []
        for state in ("checkpoints", "checkpoint"):  # full training states: gigabytes on a real drafter
            shutil.rmtree(self.dir / "train" / state, ignore_errors=True)
        trained = training_stats(windows, train.world_size)
        return trained and trained | self._predicted_training(steps, stats)

    # ------------------------------------------------------------------ the planner's predictions

    def _serving_ratio(self, generated: dict[str, Any] | None, stats: dict[str, Any],
                       records: list[dict[str, Any]]) -> dict[str, Any]:
        """Measured tokens/s over the planner's tokens/s for the pilot's own generation."""
        if not generated or not generated.get("completions_written"):
            return {}
        mine = [r for r in records if r["id"] in generated["ids"]]
        n = len(mine)
        outputs = [r["usage"]["completion_tokens"] for r in mine]
        update: dict[str, Any] = {}
        if self.resolved.stages.generate.serving.mode != "in-process":
            servers = self.resolved.stages.generate.serving.dp
            batch = sum(outputs) / servers / max(max(outputs), 1)  # a draining server's mean batch
            cap = self.recipe.stages.generate.concurrency  # None: the client keeps the planned batch in flight
            update["concurrency"] = max(1, round(batch) if cap is None else min(cap, round(batch)))
        tau = generated.get("spec_accept_length") if self.recipe.target.mtp else None
        recipe = with_mtp_accept_length(self.recipe, tau) if tau else self.recipe  # the measured tau, not the planned
        expected = predicted_tokens_per_s(predicted(recipe, self.resolved.target.facts, stats | {"samples": n},
                                                    generate=update))
        measured = float(generated["output_tokens_per_s"])
        mean = sum(outputs) / n
        sd = math.sqrt(sum((x - mean) ** 2 for x in outputs) / (n - 1)) if n > 1 else 0.0
        return {"measured_tokens_per_s": measured, "predicted_tokens_per_s": expected, "completions": n,
                "ratio": measured / expected if expected else None,
                "ratio_rse": sd / mean / math.sqrt(n) if mean else None,
                "batch": update.get("concurrency"), "wall_s": generated.get("wall_s"), "mtp_accept_length": tau,
                "startup_s": generated.get("startup_s")}

    def _predicted_training(self, steps: int, stats: dict[str, Any]) -> dict[str, Any]:
        """The table's MFU and the planner's step time for the pilot's training (measured lengths)."""
        ctx = predicted(self.recipe, self.resolved.target.facts, stats, train={"max_steps": steps})
        t = next(t for t in ctx.training.terms if t.key == "train.seconds").inputs
        return {"mfu_planned": t["mfu"], "mfu_source": t["mfu_source"], "step_s_planned": ctx.training.seconds / steps}


def run_pilot(recipe: Recipe, facts: TargetFacts | None, run_dir: Path, observer: RunObserver,
              argv: Iterable[str] = ()) -> PilotOutcome:
    """Run the pilot of `recipe` in `run_dir` (see the module docstring); PilotFailed says why not."""
    return Pilot(recipe, facts, run_dir, observer, argv).run()


def pilot_due(recipe: Recipe, run_dir: Path, calibration: PilotCalibration | None) -> bool:
    """Whether `dflashx run` runs the pilot first: `pilot.enabled` (auto: on a GPU profile), unless this
    run dir's generation is finished or a pilot already measured it under the recipe's values."""
    enabled = recipe.pilot.enabled
    if enabled is False or (enabled == "auto" and recipe.hardware.gpu is None) or not recipe.stages.generate.enabled:
        return False
    done = RunDir(Path(run_dir)).success("generate")
    if done is not None:
        return False
    return calibration is None or conditions(recipe) != calibration.conditions
