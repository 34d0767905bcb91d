"""The pilot's plan: the run's recipe at the pilot's sizes, planned as any recipe is (pure: no I/O, no torch).

`pilot_recipe(recipe, can_measure, start)` is the run's recipe with
  stages.generate  max_prompts = `start` + `pilot.prompts` (`start`: the completions the run's generate folder
                   held when this pilot attempt began) and max_minutes = `pilot.max_minutes`: operational limits,
                   so the run's generate stage keeps its key, ends unfinished at them and the full generation
                   resumes after them;
  stages.train     max_steps = `pilot.train_steps`, one checkpoint at its end, a logged window every steps / 20,
                   and the held-out τ interval of the pilot's curve (`dflashx.resolve.tau.pilot_tau_every`: at most
                   `PILOT_TAU_POINTS` measurements, the last at its last step), stated in the recipe, so the plan
                   keeps it as given;
  qc, eval, export and backup disabled (the pilot's stages are `PILOT_STAGES`), and tracking disabled.
`make_pilot_plan(recipe, run, start)` plans it with the run's target facts: one `Plan` whose `resolved` is the
pilot's own recipe, the one its estimates (the watchdog's and the ETA's times, the disk figures) came from.
"""

from __future__ import annotations

from dflashx.config.schema import STAGE_ORDER, Recipe
from dflashx.plan.plan import Plan, make_plan
from dflashx.resolve.model import ResolvedRecipe
from dflashx.resolve.tau import measurable, pilot_tau_every

PILOT_STAGES = ("ingest", "generate", "tokenize", "train")  # what a pilot runs; the rest are disabled in its recipe


def pilot_recipe(recipe: Recipe, can_measure: bool, start: int) -> Recipe:
    """The pilot's recipe (module doc), validated again. `can_measure`: whether the run's training can measure
    held-out τ (`dflashx.resolve.tau.measurable` of the run's resolved train stage)."""
    pilot, stages = recipe.pilot, recipe.stages
    steps = pilot.train_steps
    every = pilot_tau_every(stages.train.tau_every, can_measure, steps)
    update = {name: getattr(stages, name).model_copy(update={"enabled": False})
              for name in STAGE_ORDER if name not in PILOT_STAGES}
    update["generate"] = stages.generate.model_copy(update={"max_prompts": start + pilot.prompts,
                                                            "max_minutes": pilot.max_minutes})
    update["train"] = stages.train.model_copy(update={"max_steps": steps, "log_every": max(1, steps // 20),
                                                      "checkpoint_every": steps, "keep_checkpoints": 1,
                                                      "tau_every": every})
    data = recipe.model_copy(update={"stages": stages.model_copy(update=update)}).model_dump()
    data["tracking"]["mode"] = "disabled"  # the pilot's stages are no W&B runs
    return Recipe.model_validate(data)


def make_pilot_plan(recipe: Recipe, run: ResolvedRecipe, start: int) -> Plan:
    """The plan of `pilot_recipe(recipe, ...)` for the run resolved as `run`, whose generate folder held `start`
    completions when this pilot attempt began. ValueError (pydantic's too) for a `pilot.*` value the pilot's
    recipe refuses."""
    scratch = pilot_recipe(recipe, measurable(run.stages.train), start)
    return make_plan(scratch, run.target.facts)


__all__ = ["PILOT_STAGES", "make_pilot_plan", "pilot_recipe"]
