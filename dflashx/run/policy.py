"""The session's policies between its steps: which plan errors stop a run (the budget ones only without
--continue-over-budget) and when `dflashx run` pilots first. No I/O but the run folder's `_SUCCESS` marker.

`BUDGET_CODES`: the plan errors `--continue-over-budget` goes on over; `blocking(plan, over_budget_ok)`: the errors
that stop a run; `budget_breaks(plan)`: the budget errors, one line each; `pilot_due(recipe, run_dir, calibration)`;
`retrain_lr(train)`: the retrain hint.
"""

from __future__ import annotations

from pathlib import Path

from dflashx.config.schema import Recipe
from dflashx.config.stages import TrainStage
from dflashx.plan.calibration import PilotCalibration, conditions
from dflashx.plan.findings import Finding
from dflashx.plan.plan import Plan
from dflashx.run.rundir import RunDir

BUDGET_CODES = ("budget_usd", "budget_days", "budget_storage")  # plan errors --continue-over-budget goes on over


def blocking(plan: Plan, over_budget_ok: bool) -> list[Finding]:
    """The plan's errors that stop a run: all of them, but the budget ones when `over_budget_ok`."""
    return [f for f in plan.errors if not (over_budget_ok and f.code in BUDGET_CODES)]


def budget_breaks(plan: Plan) -> list[str]:
    """The plan's budget errors, one line each."""
    return [f"[{f.code}] {f.key}: {f.message}" for f in plan.errors if f.code in BUDGET_CODES]


def pilot_due(recipe: Recipe, run_dir: Path, calibration: PilotCalibration | None) -> bool:
    """Whether `dflashx run` runs the pilot first: `pilot.enabled` (auto: on a GPU profile), unless this
    run dir's generation is finished or a pilot already measured it under the recipe's values."""
    enabled = recipe.pilot.enabled
    if enabled is False or (enabled == "auto" and recipe.hardware.gpu is None) or not recipe.stages.generate.enabled:
        return False
    if RunDir(Path(run_dir)).success("generate") is not None:
        return False
    return calibration is None or conditions(recipe) != calibration.conditions


def retrain_lr(train: TrainStage) -> float | None:
    """The first thing to try when the loss does not fall: train.lr / 5; None when training is disabled."""
    return train.lr / 5 if train.enabled else None
