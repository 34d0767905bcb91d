"""The pilot's run folder `pilot/` and what the pilot keeps in the run's: files only, no stage runs here.

`pilot/` is an ordinary run folder (the orchestrator's manifest, keys, `_STARTED` / `_SUCCESS` markers, records,
under the run's lock) with the pilot's recipe.yaml and plan.json (`dflashx.run.orchestrator.describe_run`).
`attempt` is this pilot attempt's plan: pilot/plan.json's when a pilot makes the same plan again (an interrupted
attempt, which resumes), else a new one. Its tokenize and train stages read two of the run's artifacts, which
`adopt_inputs` copies in and registers under the names the run's stages read them by: `generate.completions`
(the completions this pilot measures) and `ingest.eval_prompts` (the held-out τ slice); a copy by content, so an
unchanged input keeps the stages' keys. After measuring, `drop_states` deletes the training's states and
drafters (gigabytes on a real drafter; their entries become garbage) and `save_calibration` writes
pilot/calibration.json, registered in the run's manifest as `pilot.calibration` (inventory and backup see it).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from dflashx.data.jsonl import iter_shards, write_jsonl_atomic
from dflashx.plan.calibration import PilotCalibration
from dflashx.config.schema import Recipe
from dflashx.plan.pilot import make_pilot_plan
from dflashx.plan.plan import Plan, PlanFileError
from dflashx.resolve.model import ResolvedRecipe
from dflashx.run.layout import PILOT_DIR, calibration_path
from dflashx.run.rundir import PLAN_FILE, load_plan
from dflashx.stages.train import HELDOUT
from dflashx.store.manifest import Manifest, atomic_write_json
from dflashx.track.redact import redact

COMPLETIONS = "generate.completions"


def completions(run_dir: Path) -> int:
    """The completions the run's generate folder holds."""
    folder = run_dir / "generate" / "completions"
    return sum(1 for _ in iter_shards(folder)) if folder.is_dir() else 0


def attempt(recipe: Recipe, run: ResolvedRecipe, run_dir: Path) -> tuple[Plan, bool]:
    """This pilot attempt's plan, and whether it resumes an interrupted one: the attempt pilot/plan.json holds
    (written before its stages, open until calibration.json is written after it) when a pilot makes the same
    plan again (the same recipe, resolved the same), else a new one from the completions the run holds now."""
    saved, cal = run_dir / PILOT_DIR / PLAN_FILE, calibration_path(run_dir)
    if saved.is_file() and not (cal.is_file() and cal.stat().st_mtime_ns >= saved.stat().st_mtime_ns):
        try:
            old = load_plan(saved)
        except PlanFileError:
            old = None  # not a plan this dflashx reads: a new attempt
        if old is not None and old.resolved is not None:
            again = make_pilot_plan(recipe, run, (old.resolved.stages.generate.max_prompts or 0) - recipe.pilot.prompts)
            assert again.resolved is not None
            if old.resolved.model_dump(mode="json") == redact(again.resolved.model_dump(mode="json")):
                return again, True
    return make_pilot_plan(recipe, run, completions(run_dir)), False


def adopt_inputs(run_dir: Path, ids: Iterable[str], tau: bool) -> None:
    """Copy the run's completions `ids` (and, when `tau`, its held-out prompts) into pilot/ and register them there
    as the outputs of the run's generate (and ingest) stages."""
    folder, wanted = run_dir / PILOT_DIR, set(ids)
    shard = folder / "completions" / "shard-00000.jsonl"
    write_jsonl_atomic(shard, (r for r in iter_shards(run_dir / "generate" / "completions") if r["id"] in wanted))
    adopted = [(COMPLETIONS, shard.parent, f"the pilot's {len(wanted)} completions (a copy)")]
    heldout = Manifest.load(run_dir).get(HELDOUT)
    if tau and heldout is not None:
        copy = folder / Path(heldout.path).name
        shutil.copyfile(run_dir / heldout.path, copy)
        adopted.append((HELDOUT, copy, "the run's held-out prompts (a copy): the held-out τ slice"))
    manifest = Manifest.load(folder)
    for name, path, description in adopted:
        stage, artifact = name.split(".")
        manifest.register(stage, artifact, path, "replaceable", description=description)
    manifest.save()


def drop_states(run_dir: Path) -> None:
    """Delete the pilot's training states and drafters; their entries in pilot/'s manifest become garbage."""
    from dflashx.dflash.checkpoint import BEST_TAU  # torch: the plan path never pays for it

    folder = run_dir / PILOT_DIR
    for state in ("checkpoints", "checkpoint", BEST_TAU):
        shutil.rmtree(folder / "train" / state, ignore_errors=True)
    manifest = Manifest.load(folder)
    gone = [e.name for e in manifest.by_stage("train") if not (folder / e.path).exists()]
    if gone:
        manifest.mark_garbage(gone)
        manifest.save()


def save_calibration(run_dir: Path, cal: PilotCalibration) -> Path:
    """pilot/calibration.json, registered in the run's manifest as `pilot.calibration`."""
    path = calibration_path(run_dir)
    atomic_write_json(path, cal.model_dump(mode="json"))
    manifest = Manifest.load(run_dir)
    manifest.register(PILOT_DIR, "calibration", path, "replaceable",
                      description="what `dflashx pilot` measured; `dflashx plan` applies it")
    manifest.save()
    return path
