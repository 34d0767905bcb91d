"""`dflashx pilot`: measure what the plan assumed on a few hundred prompts, before the big spend.

The pilot is the run's own pipeline on a smaller recipe: `scratch_recipe` overrides the run's recipe
(`stages.generate.max_prompts` = `pilot.prompts`, `stages.generate.max_minutes` = `pilot.max_minutes`,
`stages.train.max_steps` = `pilot.train_steps` with one checkpoint at the end, tracking disabled) and
resolves it as any recipe is resolved, with the held-out τ interval `dflashx.resolve.tau.pilot_tau_every`
(at most four measurements over the pilot's steps, the last at its last step). Every step runs through
`run_pipeline` (the orchestrator's stage keys, `_STARTED` / `_SUCCESS` markers, set-aside folders, records
and manifest) under the run lock the session holds for the pilot and the stages after it (`held`):
  1. ingest   the run's ingest stage: the real prompt count;
  2. generate the run's generate stage under the run's key (the limits are operational): it stops once
              `generate/completions` holds `pilot.prompts` more completions than when this pilot attempt
              began (or after `pilot.max_minutes`), unfinished, so the full generation resumes after them and
              never asks for a prompt twice; the run's recipe.yaml and plan.json stay the run's. What it
              measured goes to `pilot/attempt.json` (`ATTEMPT`, with the conditions it ran under), which a
              killed pilot under the same conditions reads back;
  3. tokenize and train  the real stages in the pilot's own run folder `pilot/` (its manifest, keys and
              markers, not artifacts of the run) on the first `pilot.prompts` completions, which the pilot
              registers there as `generate.completions`, with the run's held-out prompts registered there as
              `ingest.eval_prompts` (the τ slice, as the run's train stage reads it); train re-runs each
              attempt (forced: its key leaves out the operational values the MFU depends on) unless the
              attempt resumes its own interrupted one; the DeepSpeed states and drafters are deleted after;
  4. measure  lengths of every completion present (a histogram, truncation, the standard error of
              the mean by source), generation tokens/s against the planner's prediction for the
              pilot's own conditions (`serving_ratio`; with the MTP head, predicted at the accepted length
              the servers reported, which is itself calibrated), the trainer's MFU, tokens/s and step time,
              and the held-out τ curve (`PilotCalibration.tau_curve`: a measurement the rules read);
  5. write    `pilot/calibration.json` (`PilotCalibration`), which `dflashx plan` of the same
              recipe applies, and re-plan with it (the one plan after the session's).
A killed pilot resumes: the generation after the completions written, the scratch stages by their keys.
The prediction for the pilot's generation: its completions all start at once per server and drain,
so a server's mean batch is (its output tokens) / (its longest completion), not the steady batch:
the plan is made for that batch (`stages.generate.concurrency`) with the measured lengths and
without any earlier serving calibration. The transformers backend batches the same way in the pilot
as in the full run, so its prediction needs no such change.
"""

from __future__ import annotations

import json
import math
import shutil
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from dflashx.config.schema import Recipe
from dflashx.data.jsonl import iter_jsonl, iter_shards, write_jsonl_atomic
from dflashx.dflash.tau_record import curve_of, is_tau_row
from dflashx.plan.calibration import (
    PilotCalibration, conditions, predicted, predicted_tokens_per_s, with_mtp_accept_length,
)
from dflashx.plan.plan import Plan, make_plan
from dflashx.resolve import resolve
from dflashx.resolve.model import ResolvedRecipe
from dflashx.resolve.tau import TauPoint, measurable, pilot_tau_every, with_tau_every
from dflashx.run.graph import Selection, select
from dflashx.run.layout import PILOT_DIR, calibration_path
from dflashx.run.observer import RunObserver, StageOutcome
from dflashx.run.orchestrator import run_pipeline
from dflashx.run.pilot_measure import length_stats, slim, source_weights, training_stats
from dflashx.run.roundtrip import ROUNDTRIP_DIR, run_gate
from dflashx.run.rundir import RunDir
from dflashx.stages.train import HELDOUT
from dflashx.store.manifest import Manifest, atomic_write_json, atomic_write_text, utc_now
from dflashx.targets.registry import TargetFacts
from dflashx.track.redact import redact_text

BUDGET_CODES = ("budget_usd", "budget_days", "budget_storage")  # plan errors --continue-over-budget goes on over
ATTEMPT = "attempt.json"  # pilot/: this pilot attempt's conditions, first completion count and generation figures
SKIP = "pilot.roundtrip: false skips the gate"


class PilotFailed(RuntimeError):
    """A pilot step failed; the message says which and where its log is."""


@dataclass
class PilotOutcome:
    calibration: PilotCalibration
    path: Path  # calibration.json
    before: Plan  # the plan the pilot ran under (the session's)
    after: Plan  # the plan with them
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per pilot step


def scratch_recipe(recipe: Recipe) -> Recipe:
    """The pilot's recipe: the run's, with the pilot's sizes (module doc); validated again."""
    pilot, gen, train = recipe.pilot, recipe.stages.generate, recipe.stages.train
    steps = pilot.train_steps
    stages = recipe.stages.model_copy(update={
        "generate": gen.model_copy(update={"max_prompts": pilot.prompts, "max_minutes": pilot.max_minutes}),
        "train": train.model_copy(update={"max_steps": steps, "log_every": max(1, steps // 20),
                                          "checkpoint_every": steps, "keep_checkpoints": 1})})
    data = recipe.model_copy(update={"stages": stages}).model_dump()
    data["tracking"]["mode"] = "disabled"  # the scratch stages are no W&B runs
    return Recipe.model_validate(data)


def scratch_resolved(recipe: Recipe, facts: TargetFacts) -> ResolvedRecipe:
    """`scratch_recipe` resolved, with the pilot's held-out τ interval (`pilot_tau_every`) decided."""
    scratch = resolve(scratch_recipe(recipe), facts)
    every = pilot_tau_every(recipe.stages.train.tau_every, measurable(scratch.stages.train), recipe.pilot.train_steps)
    return with_tau_every(scratch, every)


def scratch_plan(recipe: Recipe, facts: TargetFacts, scratch: ResolvedRecipe) -> Plan:
    """The plan the pilot's own stages run under: the scratch recipe planned (its estimates: the stall
    watchdog's and the ETA's time, the disk-full figures, the artifacts' cost), holding `scratch` itself (the
    pilot's held-out τ interval, not the planner's), so pilot/plan.json and pilot/recipe.yaml agree."""
    return replace(make_plan(scratch_recipe(recipe), facts), resolved=scratch)


class Pilot:
    """One pilot of the session's plan in one run directory, under the run lock `held`."""

    def __init__(self, recipe: Recipe, plan: Plan, run_dir: Path, observer: RunObserver, held: IO[str],
                 argv: Iterable[str] = ()):
        if not (recipe.stages.ingest.enabled and recipe.stages.generate.enabled):
            raise PilotFailed("stages.ingest and stages.generate must be enabled: the pilot measures their output")
        blocking = [f for f in plan.errors if f.code not in BUDGET_CODES]  # over budget: the session decides
        if plan.resolved is None or blocking:
            named = ", ".join(f"[{f.code}] {f.key}" for f in blocking)
            raise PilotFailed(f"the plan has {len(blocking)} error(s) ({named}): fix them first (`dflashx plan`)")
        self.recipe, self.before, self.observer, self.held, self.argv = recipe, plan, observer, held, list(argv)
        self.resolved: ResolvedRecipe = plan.resolved
        try:
            self.scratch = scratch_resolved(recipe, self.resolved.target.facts)
            self.scratch_plan = scratch_plan(recipe, self.resolved.target.facts, self.scratch)
        except ValueError as e:  # pydantic's ValidationError too: a pilot.* value the scratch recipe refuses
            raise PilotFailed(f"the pilot's recipe (the run's with pilot.*) is invalid: {e}") from None
        self.rundir = RunDir(Path(run_dir).resolve())
        self.dir = self.rundir.path / PILOT_DIR
        self.seconds: dict[str, float] = {}
        self.resumed = False  # this attempt resumes a killed one under the same conditions (`_attempt`)

    def run(self) -> PilotOutcome:
        if self.recipe.pilot.roundtrip:
            self._roundtrip()
        self._pipeline(self.resolved, self.before, self.rundir.path, select(until="ingest"),
                       "the run's own, to count the prompts")
        cal = self._measure()
        self.seconds["total"] = sum(self.seconds.values())
        path = self._save(cal)
        (self.dir / ATTEMPT).unlink(missing_ok=True)  # measured and saved: the next pilot measures anew
        return PilotOutcome(cal, path, self.before, make_plan(self.recipe, self.resolved.target.facts, cal),
                            self.seconds)

    def _roundtrip(self) -> None:
        """The export round-trip gate (`dflashx.run.roundtrip`) in pilot/roundtrip/, before any generation."""
        self.observer.message("pilot roundtrip: overfit two replies, export, load back, decode with the target")
        folder = self.dir / ROUNDTRIP_DIR
        try:
            result = run_gate(self.resolved, folder)
        except Exception as e:  # noqa: BLE001 - the sources, the target's load, the drafter's build: a clear stop
            log = folder / "error.log"
            atomic_write_text(log, redact_text("".join(traceback.format_exception(e))))
            cause = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
            raise PilotFailed(f"roundtrip gate: {redact_text(cause)} (traceback in {log}; {SKIP})") from None
        self.seconds["roundtrip"] = result.seconds
        if not result.ok:
            raise PilotFailed(f"{result.message()}\n(the exports are kept in {folder} for inspection; {SKIP})")
        self.observer.message(result.message())

    def _pipeline(self, recipe: ResolvedRecipe, plan: Plan, run_dir: Path, selection: Selection, what: str,
                  save_recipe: bool = True) -> list[StageOutcome]:
        """The stages through the run's orchestrator under the held lock; a failure stops the pilot.
        `save_recipe` False: the run's recipe.yaml and plan.json stay the run's (`run_pipeline`)."""
        self.observer.message(f"pilot {' and '.join(selection.stages)}: {what}")
        result = run_pipeline(recipe, plan, run_dir, selection, self.argv, observer=self.observer,
                              held=self.held, save_recipe=save_recipe)
        for o in result.outcomes:
            if o.state == "failed":
                raise PilotFailed(f"pilot {o.name} failed: {o.message} (log: {run_dir / o.name / 'stage.log'})")
            self.seconds[o.name] = self.seconds.get(o.name, 0.0) + (o.duration_s or 0.0)
        return result.outcomes

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
        weights, samples, prompt_bytes = source_weights(iter_shards(self.rundir.path
                                                                    / manifest.entries["ingest.prompts"].path))
        generated = self._generate()
        completions = self.rundir.stage_dir("generate") / "completions"
        records = [slim(r) for r in iter_shards(completions)] if completions.is_dir() else []
        if not records:
            raise PilotFailed("no completion to measure: the pilot generated none")
        train = self.resolved.stages.train
        stats, lengths = length_stats(records, weights, self.resolved.stages.generate.max_tokens, train.max_length)
        stats |= {"samples": samples, "prompt_bytes_mean": prompt_bytes}
        trained: dict[str, Any] | None = None
        curve: list[TauPoint] = []
        if self.recipe.stages.tokenize.enabled and train.enabled:
            trained, curve = self._train(completions, [r["id"] for r in records[: self.recipe.pilot.prompts]], stats)
        serving = self._serving_ratio(generated, stats, records)
        measured = {"lengths": lengths, "generation": serving, "training": trained, "samples": samples,
                    "seconds": self.seconds}
        return PilotCalibration(
            run_id=(self.rundir.info() or {}).get("run_id", self.rundir.path.name), run_dir=str(self.rundir.path),
            measured_at=utc_now(), conditions=conditions(self.recipe), stats=stats,
            serving_ratio=serving.get("ratio"), serving_ratio_rse=serving.get("ratio_rse"),
            mtp_accept_length=serving.get("mtp_accept_length"),
            training_mfu=min(trained["mfu"], 1.0) if trained else None,
            training_mfu_rse=trained.get("mfu_rse") if trained else None,
            tau_probe_seconds=trained.get("tau_probe_s") if trained else None, tau_curve=curve, measured=measured)

    def _attempt(self, count: int) -> dict[str, Any]:
        """This pilot attempt (pilot/attempt.json): the one a killed attempt under the same conditions left
        (`resumed`), else a new one from the `count` completions the folder holds now."""
        path, now = self.dir / ATTEMPT, conditions(self.recipe)
        if path.is_file():
            old = json.loads(path.read_text(encoding="utf-8"))
            if old.get("conditions") == now:
                self.resumed = True
                return old
        attempt = {"conditions": now, "start": count}
        atomic_write_json(path, attempt)
        return attempt

    def _generate(self) -> dict[str, Any] | None:
        """The run's generate stage with the pilot's limits (module doc): `pilot.prompts` more completions than
        the folder held when this attempt began; what it measured (its metrics and the ids it generated, kept
        in pilot/attempt.json: a resumed attempt reads them back), or None when it generated nothing (the
        run's generation is finished)."""
        completions = self.rundir.stage_dir("generate") / "completions"
        before = _ids(completions)
        attempt = self._attempt(len(before))
        if "generated" in attempt:  # a killed attempt generated and measured already
            self.observer.message("= pilot generate: measured by the interrupted pilot; reading its figures")
            return attempt["generated"]
        limit = attempt["start"] + self.recipe.pilot.prompts
        outcome = self._pipeline(_max_prompts(self.scratch, limit), self.scratch_plan, self.rundir.path,
                                 select(only="generate"),
                                 f"{self.recipe.pilot.prompts} prompts, kept for the full generation",
                                 save_recipe=False)[0]
        if outcome.state == "skipped":
            self.observer.message("= pilot generate: the run's generation is finished; measuring its completions")
        new = _ids(completions) - before
        generated = outcome.metrics | {"ids": sorted(new)} if new and outcome.metrics.get("completions_written") \
            else None
        atomic_write_json(self.dir / ATTEMPT, attempt | {"generated": generated})
        return generated

    def _train(self, completions: Path, ids: list[str],
               stats: dict[str, Any]) -> tuple[dict[str, Any] | None, list[TauPoint]]:
        """Tokenize and train on `ids` with the real stages in pilot/ (its own run folder): the trainer's windows
        and the held-out τ curve (empty when none was measured)."""
        wanted = set(ids)
        shard = self.dir / "completions" / "shard-00000.jsonl"
        write_jsonl_atomic(shard, (r for r in iter_shards(completions) if r["id"] in wanted))
        self._register("generate", "completions", shard.parent, f"the pilot's first {len(ids)} completions (a copy)")
        self._heldout()
        train = self.scratch.stages.train
        every = f", held-out τ every {train.tau_every}" if train.tau_every else ""
        scratch = RunDir(self.dir)
        interrupted = scratch.started("train") is not None and scratch.success("train") is None
        # train measures under this attempt's conditions (its key leaves the operational ones out): it re-runs,
        # unless this attempt resumes its own interrupted training
        force = set() if self.resumed and interrupted else {"train"}
        self._pipeline(self.scratch, self.scratch_plan, self.dir, Selection(stages=["tokenize", "train"], force=force),
                       f"{len(ids)} completions into {PILOT_DIR}/, "
                       f"{train.max_steps} steps to measure MFU and tokens/s{every}")
        metrics = self.dir / "train" / "logs" / "metrics.jsonl"
        rows = list(iter_jsonl(metrics)) if metrics.is_file() else []
        self._drop_states()
        trained = training_stats([r for r in rows if not is_tau_row(r)], train.world_size,  # the windows
                                 [r for r in rows if is_tau_row(r)])
        return trained and trained | self._predicted_training(train.max_steps or 1, stats), curve_of(metrics)

    def _drop_states(self) -> None:
        """Delete the scratch training's states and drafters (gigabytes on a real drafter); their entries in
        pilot/'s manifest become garbage."""
        from dflashx.dflash.checkpoint import BEST_TAU

        for state in ("checkpoints", "checkpoint", BEST_TAU):
            shutil.rmtree(self.dir / "train" / state, ignore_errors=True)
        manifest = Manifest.load(self.dir)
        gone = [e.name for e in manifest.by_stage("train") if not (self.dir / e.path).exists()]
        if gone:
            manifest.mark_garbage(gone)
            manifest.save()

    def _register(self, stage: str, name: str, path: Path, description: str) -> None:
        """A scratch stage's input in pilot/'s manifest, by content: an unchanged one keeps their keys."""
        manifest = Manifest.load(self.dir)
        manifest.register(stage, name, path, "replaceable", description=description)
        manifest.save()

    def _heldout(self) -> None:
        """The run's held-out prompts (`ingest.eval_prompts`) copied into pilot/ and registered there under that
        name, so the pilot's train stage measures held-out τ on them as the run's train stage does; none when the
        ingest held none out or the pilot measures no τ."""
        entry = Manifest.load(self.rundir.path).get(HELDOUT)
        if entry is None or not self.scratch.stages.train.tau_every:
            return
        stage, name = HELDOUT.split(".")
        copy = self.dir / Path(entry.path).name
        shutil.copyfile(self.rundir.path / entry.path, copy)
        self._register(stage, name, copy, "the run's held-out prompts (a copy): the held-out τ slice")

    # ------------------------------------------------------------------ the planner's predictions

    def _serving_ratio(self, generated: dict[str, Any] | None, stats: dict[str, Any],
                       records: list[dict[str, Any]]) -> dict[str, Any]:
        """Measured tokens/s over the planner's tokens/s for the pilot's own generation."""
        if not generated:
            return {}
        ids = set(generated["ids"])
        mine = [r for r in records if r["id"] in ids]
        n = len(mine)
        outputs = [r["usage"]["completion_tokens"] for r in mine]
        update: dict[str, Any] = {}
        serving = self.resolved.stages.generate.serving
        if serving.mode != "in-process":
            batch = sum(outputs) / serving.dp / max(max(outputs), 1)  # a draining server's mean batch
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
        """The table's MFU and the planner's step time for the pilot's training (measured lengths; no held-out τ
        measurement: the trainer's windows leave them out)."""
        ctx = predicted(self.recipe, self.resolved.target.facts, stats, train={"max_steps": steps, "tau_every": 0})
        t = next(t for t in ctx.training.terms if t.key == "train.seconds").inputs
        return {"mfu_planned": t["mfu"], "mfu_source": t["mfu_source"], "step_s_planned": ctx.training.seconds / steps}


def _max_prompts(resolved: ResolvedRecipe, limit: int) -> ResolvedRecipe:
    """`resolved` with `stages.generate.max_prompts` = `limit` (an operational limit: the key is unchanged)."""
    stages = resolved.stages
    generate = stages.generate.model_copy(update={"max_prompts": limit})
    return resolved.model_copy(update={"stages": stages.model_copy(update={"generate": generate})})


def _ids(folder: Path) -> set[str]:
    return {r["id"] for r in iter_shards(folder)} if folder.is_dir() else set()


def run_pilot(recipe: Recipe, plan: Plan, run_dir: Path, observer: RunObserver, held: IO[str],
              argv: Iterable[str] = ()) -> PilotOutcome:
    """Run the pilot of `recipe` (planned as `plan`) in `run_dir` under the run lock `held` (see the
    module docstring); PilotFailed says why not."""
    return Pilot(recipe, plan, run_dir, observer, held, argv).run()


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
