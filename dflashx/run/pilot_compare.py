"""What the pilot adds to its stages: the comparison of each measured figure with the planner's prediction for
the pilot's own conditions, and the calibration that comes of it (`PilotCalibration`).

`generation(records)`: the metrics of the run's last generate attempt that wrote completions (records.jsonl:
what the pilot's generation measured, read back as well by a pilot that resumes after it). `prediction(...)`: the
planner's models, uncalibrated, for the pilot's conditions, as one plan context (`dflashx.plan.calibration.
predicted`): the measured lengths, the pilot's completions, the steps it trained without held-out τ (the
trainer's windows leave those out), a server's draining batch, and with the target's MTP head the accepted
length the servers reported. Its completions all start at once per server and drain, so a server's mean
batch is (its output tokens) / (its longest completion), not the steady batch: the prediction is made for that
batch (`stages.generate.concurrency`); the transformers backend batches the same way in the pilot as in the
full run. `serving(...)` and `training(...)` put measured and predicted side by side (the pilot's table,
`dflashx.report.pilot`); `calibration(...)` is what `dflashx plan` of the same recipe applies.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dflashx.config.schema import Recipe
from dflashx.data.jsonl import iter_jsonl
from dflashx.plan.calibration import (
    PilotCalibration, conditions, predicted, predicted_tokens_per_s, with_mtp_accept_length,
)
from dflashx.plan.context import PlanContext
from dflashx.resolve.model import ResolvedRecipe
from dflashx.resolve.tau import TauPoint
from dflashx.store.manifest import utc_now

ENDS = ("stage_unfinished", "stage_end")


def generation(records: Path) -> dict[str, Any] | None:
    """The metrics of the last generate attempt in `records` (a run's records.jsonl) that wrote completions."""
    rows = [r for r in iter_jsonl(records) if r.get("stage") == "generate" and r.get("event") in ENDS] \
        if records.is_file() else []
    written = [r["metrics"] for r in rows if (r.get("metrics") or {}).get("completions_written")]
    return written[-1] if written else None


def prediction(recipe: Recipe, resolved: ResolvedRecipe, stats: dict[str, Any], outputs: list[int],
               generated: dict[str, Any] | None) -> tuple[PlanContext, int | None, float | None]:
    """(the planner's context for the pilot's conditions, the draining batch it assumed, the MTP accepted length)
    for the pilot's completions' output tokens `outputs` and what its generation measured (`generated`)."""
    serving, batch = resolved.stages.generate.serving, None
    if outputs and serving.mode != "in-process":
        drain = sum(outputs) / serving.dp / max(max(outputs), 1)  # a draining server's mean batch
        cap = recipe.stages.generate.concurrency  # None: the client keeps the planned batch in flight
        batch = max(1, round(drain) if cap is None else min(cap, round(drain)))
    tau = (generated or {}).get("spec_accept_length") if recipe.target.mtp else None
    measured = with_mtp_accept_length(recipe, tau) if tau else recipe  # the measured tau, not the planned
    ctx = predicted(measured, resolved.target.facts, stats | {"samples": len(outputs) or stats["samples"]},
                    generate={} if batch is None else {"concurrency": batch},
                    train={"max_steps": recipe.pilot.train_steps, "tau_every": 0})
    return ctx, batch, tau


def serving(generated: dict[str, Any], outputs: list[int], ctx: PlanContext, batch: int | None,
            tau: float | None) -> dict[str, Any]:
    """Measured tokens/s over the planner's tokens/s for the pilot's own generation, and its spread."""
    n, expected = len(outputs), predicted_tokens_per_s(ctx)
    measured = float(generated["output_tokens_per_s"])
    mean = sum(outputs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in outputs) / (n - 1)) if n > 1 else 0.0
    return {"measured_tokens_per_s": measured, "predicted_tokens_per_s": expected, "completions": n,
            "ratio": measured / expected if expected else None, "ratio_rse": sd / mean / math.sqrt(n) if mean else None,
            "batch": batch, "wall_s": generated.get("wall_s"), "mtp_accept_length": tau,
            "startup_s": generated.get("startup_s")}


def training(measured: dict[str, Any], ctx: PlanContext, steps: int) -> dict[str, Any]:
    """The trainer's figures with the table's MFU and the planner's step time for the pilot's training."""
    t = next(t for t in ctx.training.terms if t.key == "train.seconds").inputs
    return measured | {"mfu_planned": t["mfu"], "mfu_source": t["mfu_source"],
                       "step_s_planned": ctx.training.seconds / steps}


def calibration(recipe: Recipe, run: tuple[str, Path], stats: dict[str, Any], measured: dict[str, Any],
                curve: Iterable[TauPoint]) -> PilotCalibration:
    """What `dflashx plan` applies: `measured` holds the pilot's `lengths`, `generation`, `training` (None when it
    did not train), `samples` and `seconds`; `run` is (run id, run folder)."""
    serving_, trained = measured["generation"], measured["training"]
    return PilotCalibration(
        run_id=run[0], run_dir=str(run[1]), measured_at=utc_now(), conditions=conditions(recipe), stats=stats,
        serving_ratio=serving_.get("ratio"), serving_ratio_rse=serving_.get("ratio_rse"),
        mtp_accept_length=serving_.get("mtp_accept_length"),
        training_mfu=min(trained["mfu"], 1.0) if trained else None,
        training_mfu_rse=trained.get("mfu_rse") if trained else None,
        tau_probe_seconds=trained.get("tau_probe_s") if trained else None,
        decode_cycle_seconds=trained.get("decode_cycle_s") if trained else None,
        ingest_seconds=measured["seconds"].get("ingest") or None, tau_curve=list(curve),
        measured=measured)
