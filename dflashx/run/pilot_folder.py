"""The pilot's run folder `pilot/` and what the pilot keeps in the run's: files only, no stage runs here.

`pilot/` is an ordinary run folder (the orchestrator's manifest, keys, `_STARTED` / `_SUCCESS` markers, records,
lock held by the session) with the pilot's recipe.yaml and plan.json (`dflashx.run.orchestrator.describe_run`).
Its tokenize and train stages read two of the run's artifacts, which `adopt_inputs` copies in and registers
under the names the run's stages read them by: `generate.completions` (the completions this pilot measures) and
`ingest.eval_prompts` (the held-out τ slice); a copy by content, so an unchanged input keeps the stages' keys.
`same_attempt` says whether pilot/plan.json is the plan a pilot makes now: an interrupted attempt, which
resumes. After measuring, `drop_states` deletes the training's states and drafters (gigabytes on a real
drafter; their entries become garbage) and `save_calibration` writes pilot/calibration.json, registered in the
run's manifest as `pilot.calibration` (inventory and backup see it).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from dflashx.data.jsonl import iter_shards, write_jsonl_atomic
from dflashx.plan.calibration import PilotCalibration
from dflashx.plan.plan import Plan
from dflashx.run.layout import PILOT_DIR, calibration_path
from dflashx.stages.train import HELDOUT
from dflashx.store.manifest import Manifest, atomic_write_json
from dflashx.track.redact import redact

COMPLETIONS = "generate.completions"


def same_attempt(saved: Plan, plan: Plan) -> bool:
    """Whether the `saved` plan (pilot/plan.json, redacted) is `plan`: the same recipe, resolved the same."""
    assert saved.resolved is not None and plan.resolved is not None
    return bool(saved.resolved.model_dump(mode="json") == redact(plan.resolved.model_dump(mode="json")))


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
