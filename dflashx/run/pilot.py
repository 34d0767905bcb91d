"""`dflashx pilot`: measure what the plan assumed on a few hundred prompts, before the big spend.

The pilot is a plan (`dflashx.plan.pilot.make_pilot_plan`: the run's recipe at the pilot's sizes, its stages
ingest, generate, tokenize and train, its limits), run by the orchestrator like any run, under the run lock the
session holds for the pilot and the stages after it (`held`):
  0. gate      the export round-trip gate (`dflashx.run.roundtrip`, unless `pilot.roundtrip: false`);
  1. ingest and generate  in the run's folder, the run's own stages under their keys (the pilot's limits are
               operational): generate ends unfinished at `pilot.prompts` more completions than the folder held
               when this pilot attempt began (or after `pilot.max_minutes`), so the full generation resumes after
               them and never asks for a prompt twice; the run's recipe.yaml and plan.json stay the run's;
  2. tokenize and train  in the pilot's own run folder `pilot/` (its recipe.yaml, plan.json, manifest, keys,
               markers and records: `dflashx.run.pilot_folder`) on the first `pilot.prompts` completions; train
               re-runs each attempt (its key leaves out the operational values the MFU depends on) unless the
               attempt resumes its own interrupted one; the states and drafters are deleted after;
  3. compare   every figure against the planner's prediction for the pilot's conditions, and write
               `pilot/calibration.json` (`dflashx.run.pilot_compare`), which `dflashx plan` of the same recipe
               applies; then re-plan with it (the one plan after the session's), the once-per-process costs its stages
               paid left out (the run's stages follow in this process: `fixed.process_parts`).
A killed pilot resumes: an attempt is pilot/plan.json (saved before its stages, until its calibration is
written), which a pilot under the same values makes again; its generation and training resume by their keys,
and what its generation measured is read back from the run's records.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from dflashx.config.schema import Recipe
from dflashx.data.jsonl import iter_jsonl, iter_shards
from dflashx.dflash.tau_record import curve_of, is_tau_row, metrics_file
from dflashx.plan.calibration import PilotCalibration
from dflashx.plan.estimates.fixed import process_parts
from dflashx.plan.plan import Plan, make_plan
from dflashx.resolve.tau import TauPoint
from dflashx.run import pilot_compare as compare
from dflashx.run.graph import Selection
from dflashx.run.layout import PILOT_DIR
from dflashx.run.observer import RunObserver
from dflashx.run.orchestrator import describe_run, run_pipeline
from dflashx.run.pilot_folder import adopt_inputs, attempt, completions, drop_states, save_calibration
from dflashx.run.pilot_measure import length_stats, slim, source_weights, training_stats
from dflashx.run.policy import blocking
from dflashx.run.roundtrip import ROUNDTRIP_DIR, run_gate
from dflashx.run.rundir import RunDir
from dflashx.store.manifest import Manifest, atomic_write_text
from dflashx.track.redact import redact_text

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


class Pilot:
    """One pilot of the session's plan in one run directory, under the run lock `held`."""

    def __init__(self, recipe: Recipe, plan: Plan, run_dir: Path, observer: RunObserver, held: IO[str],
                 argv: Iterable[str] = ()):
        if not (recipe.stages.ingest.enabled and recipe.stages.generate.enabled):
            raise PilotFailed("stages.ingest and stages.generate must be enabled: the pilot measures their output")
        errors = blocking(plan, over_budget_ok=True)  # over budget: the session decides
        if plan.resolved is None or errors:
            named = ", ".join(f"[{f.code}] {f.key}" for f in errors)
            raise PilotFailed(f"the plan has {len(errors)} error(s) ({named}): fix them first (`dflashx plan`)")
        self.recipe, self.before, self.observer, self.held, self.argv = recipe, plan, observer, held, list(argv)
        self.run_dir, self.resolved = Path(run_dir).resolve(), plan.resolved
        self.dir = self.run_dir / PILOT_DIR
        self.seconds: dict[str, float] = {}
        try:
            self.plan, self.resumed = attempt(self.recipe, self.resolved, self.run_dir)
        except ValueError as e:  # pydantic's ValidationError too: a pilot.* value the pilot's recipe refuses
            raise PilotFailed(f"the pilot's recipe (the run's with pilot.*) is invalid: {e}") from None
        if self.plan.resolved is None:  # the run's recipe resolved: only a pilot.* value can break it
            raise PilotFailed(f"the pilot's recipe does not resolve: {self.plan.errors[0].message}")
        self.pilot = self.plan.resolved

    def run(self) -> PilotOutcome:
        if self.recipe.pilot.roundtrip:
            self._roundtrip()
        describe_run(self.dir, self.plan)
        self._stages(self.run_dir, Selection(["ingest"]), "the run's own, to count the prompts")
        cal = self._measure(self._generate())
        self.seconds["total"] = sum(self.seconds.values())
        path = save_calibration(self.run_dir, cal)
        replan = make_plan(self.recipe, self.resolved.target.facts, cal, paid=process_parts(self.pilot))
        return PilotOutcome(cal, path, self.before, replan, self.seconds)

    def _generate(self) -> bool:
        """The run's generate stage up to the pilot's limit; False when the run's generation was finished."""
        if RunDir(self.run_dir).success("generate") is not None:
            self.observer.message("= pilot generate: the run's generation is finished; measuring its completions")
            return False
        if completions(self.run_dir) >= (self.pilot.stages.generate.max_prompts or 0):
            self.observer.message("= pilot generate: generated by the interrupted pilot; reading its figures")
        else:
            self._stages(self.run_dir, Selection(["generate"]),
                         f"{self.recipe.pilot.prompts} prompts, kept for the full generation")
        return True

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

    def _stages(self, run_dir: Path, selection: Selection, what: str) -> None:
        """The pilot plan's stages through the orchestrator under the held lock; a failure stops the pilot."""
        self.observer.message(f"pilot {' and '.join(selection.stages)}: {what}")
        result = run_pipeline(self.pilot, self.plan, run_dir, selection, self.argv, observer=self.observer,
                              held=self.held)
        for o in result.outcomes:
            if o.state == "failed":
                raise PilotFailed(f"pilot {o.name} failed: {o.message} (log: {run_dir / o.name / 'stage.log'})")
            self.seconds[o.name] = self.seconds.get(o.name, 0.0) + (o.duration_s or 0.0)

    def _measure(self, generating: bool) -> PilotCalibration:
        prompts = Manifest.load(self.run_dir).entries["ingest.prompts"].path
        weights, samples, prompt_bytes = source_weights(iter_shards(self.run_dir / prompts))
        folder = self.run_dir / "generate" / "completions"
        records = [slim(r) for r in iter_shards(folder)] if folder.is_dir() else []
        if not records:
            raise PilotFailed("no completion to measure: the pilot generated none")
        stats, lengths = length_stats(records, weights, self.resolved.stages.generate.max_tokens,
                                      self.resolved.stages.train.max_length)
        stats |= {"samples": samples, "prompt_bytes_mean": prompt_bytes}
        generated = compare.generation(self.run_dir / "records.jsonl") if generating else None
        mine = records[-int(generated["completions_written"]):] if generated else []  # this generation's
        outputs = [int(r["usage"]["completion_tokens"]) for r in mine]
        ctx, batch, tau = compare.prediction(self.recipe, self.resolved, stats, outputs, generated)
        stats |= {"generated": len(records)}  # kept for the full generation (not the prediction's conditions)
        trained: dict[str, Any] | None = None
        curve: list[TauPoint] = []
        if self.recipe.stages.tokenize.enabled and self.recipe.stages.train.enabled:
            measured, curve = self._train([r["id"] for r in records[: self.recipe.pilot.prompts]])
            trained = measured and compare.training(measured, ctx, self.recipe.pilot.train_steps)
        figures = {"lengths": lengths, "generation": compare.serving(generated, outputs, ctx, batch, tau)
                   if generated else {}, "training": trained, "samples": samples, "seconds": self.seconds}
        run_id = (RunDir(self.run_dir).info() or {}).get("run_id", self.run_dir.name)
        return compare.calibration(self.recipe, (run_id, self.run_dir), stats, figures, curve)

    def _train(self, ids: list[str]) -> tuple[dict[str, Any] | None, list[TauPoint]]:
        """Tokenize and train on `ids` in pilot/: the trainer's windows and the held-out τ curve (empty: none)."""
        every = self.plan.stage("train").tau_every or 0
        adopt_inputs(self.run_dir, ids, tau=every > 0)
        scratch = RunDir(self.dir)
        interrupted = scratch.started("train") is not None and scratch.success("train") is None
        force = set() if self.resumed and interrupted else {"train"}  # measured under this attempt's conditions
        held_out = f", held-out τ every {every}" if every else ""
        self._stages(self.dir, Selection(["tokenize", "train"], force),
                     f"{len(ids)} completions into {PILOT_DIR}/, {self.pilot.stages.train.max_steps} steps to "
                     f"measure MFU and tokens/s{held_out}")
        metrics = metrics_file(self.dir / "train")
        rows = list(iter_jsonl(metrics)) if metrics.is_file() else []
        drop_states(self.run_dir)
        windows, probes = [r for r in rows if not is_tau_row(r)], [r for r in rows if is_tau_row(r)]
        return training_stats(windows, self.pilot.stages.train.world_size, probes), curve_of(metrics)


def run_pilot(recipe: Recipe, plan: Plan, run_dir: Path, observer: RunObserver, held: IO[str],
              argv: Iterable[str] = ()) -> PilotOutcome:
    """Run the pilot of `recipe` (planned as `plan`) in `run_dir` under the run lock `held` (see the
    module docstring); PilotFailed says why not."""
    return Pilot(recipe, plan, run_dir, observer, held, argv).run()
