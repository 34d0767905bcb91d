"""Held-out τ while training: which slice is decoded, and how often (`stages.train.tau_every`).

Every `tau_every` optimizer steps (and at the last step) rank 0 decodes the first `tau_prompts`
held-out prompts (the ingest stage's `eval_prompts`, the ones the eval stage's `heldout` suite starts
with) greedily, up to `tau_max_new_tokens` each, with the drafter as it stands
(`dflashx.dflash.tau_probe`). Unset, `tau_every` is planned once, by `tau_every` here, from the planner's
train-time estimate and its estimate of one measurement (`dflashx.plan.estimates.training`): the smallest
interval whose measurements cost at most `TAU_SHARE` of the rest of the stage's estimated time
(compute, gradient sync and the target's gathers; the plan shows the share as `train.tau_seconds`'
`share_of_rest`). Without held-out prompts
(`dataset.eval_holdout: 0`) or with the target sharded over the ranks (ZeRO-3) nothing is measured.
The planned interval is the plan's (`Plan.stage("train").tau_every`, which the train stage hands its job);
the resolved recipe keeps the recipe's own value (None: planned) and is never edited after `resolve`.
The pilot's short training measures a curve of at most `PILOT_TAU_POINTS` points instead
(`pilot_tau_every`, which the pilot's recipe states: `dflashx.plan.pilot`), whatever the full run's interval.

Public API: `TAU_SHARE`, `TAU_PROMPTS`, `TAU_MAX_NEW_TOKENS`, `tau_slice(recipe) -> (prompts,
max_new_tokens)`, `measurable(train)`, `measurements(steps, every)`, `tau_every(given, can_measure, steps,
train_seconds, probe_seconds)`, `PILOT_TAU_POINTS`, `pilot_tau_every(given, can_measure, steps)`;
`TauPoint` (one measurement) and `curve_text(points)` (a curve as findings and
reports quote it), shared by the trainer's record (`dflashx.dflash.tau_record`) and the planner's rules.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from dflashx.config.schema import Recipe
from dflashx.resolve.model import ResolvedTrainStage

TAU_SHARE = 0.05  # most the measurements may take, as a share of the rest of the train time, when tau_every is derived
TAU_PROMPTS = 8  # held-out prompts per measurement: a trend, not the eval stage's figure
TAU_MAX_NEW_TOKENS = 256  # at most this many new tokens per prompt (the eval stage's max_new_tokens when lower)
PILOT_TAU_POINTS = 4  # measurements in the pilot's training: enough to see whether τ still rises at its end


class TauPoint(BaseModel):
    """One measurement: the optimizer step and the held-out τ of the drafter at that step."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int = Field(ge=0)
    tau: float


def curve_text(points: Iterable[TauPoint]) -> str:
    """Points as findings and reports quote them: `step 50: 2.00, step 100: 2.50`."""
    return ", ".join(f"step {p.step}: {p.tau:.2f}" for p in points)


def tau_slice(recipe: Recipe) -> tuple[int, int]:
    """(held-out prompts, new tokens per prompt) of one measurement: the first prompts of the ingest
    stage's held-out split, at the eval stage's max_new_tokens capped at TAU_MAX_NEW_TOKENS."""
    return (min(recipe.dataset.eval_holdout, TAU_PROMPTS),
            min(recipe.stages.eval.max_new_tokens, TAU_MAX_NEW_TOKENS))


def measurements(steps: int, every: int) -> int:
    """Measurements a run of `steps` optimizer steps takes: every `every` steps and at the last one."""
    return math.ceil(steps / every) if every and steps else 0


def measurable(train: ResolvedTrainStage) -> bool:
    """Held-out prompts to decode, and a whole target on rank 0 to decode them with (a target sharded with
    ZeRO-3 has no whole embedding and LM head outside its forward)."""
    return train.tau_prompts > 0 and train.target_sharding == "none"


def tau_every(given: int | None, can_measure: bool, steps: int, train_seconds: float, probe_seconds: float) -> int:
    """The recipe's value; else 0 when nothing can be measured (`measurable`), else the smallest interval
    whose `measurements` cost at most TAU_SHARE of `train_seconds` (0 when even the last step's one would not)."""
    if given is not None:
        return given
    if not can_measure or steps == 0:
        return 0
    allowed = math.floor(TAU_SHARE * train_seconds / probe_seconds) if probe_seconds > 0 else steps
    return math.ceil(steps / min(allowed, steps)) if allowed >= 1 else 0


def pilot_tau_every(given: int | None, can_measure: bool, steps: int) -> int:
    """The pilot's interval over its `steps` (`pilot.train_steps`): ceil(steps / PILOT_TAU_POINTS), so that
    `measurements` is at most PILOT_TAU_POINTS, the last at the last step (200 steps: 50, 100, 150, 200);
    0 when the recipe turns τ off (`tau_every: 0`) or nothing can be measured (`measurable`). The full run's
    interval (set or derived) is not used: it is sized for the full run's steps."""
    if given == 0 or not can_measure or steps == 0:
        return 0
    return math.ceil(steps / PILOT_TAU_POINTS)

