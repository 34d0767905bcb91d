"""The pilot is a plan (issue 39): `make_pilot_plan` is the run's recipe with the pilot's limits, stages and held-out
τ interval, resolved and planned once, so the plan's `resolved` is the recipe its estimates came from; no plan's
resolved recipe is edited after `resolve` (the held-out τ interval is the plan's train stage's); the budget policy
lets only the budget errors through, and only when asked."""

from __future__ import annotations

import dataclasses

from _plan_recipes import seeds_recipe, tiny_recipe

from dflashx.config.schema import STAGE_ORDER
from dflashx.plan.findings import error
from dflashx.plan.pilot import PILOT_STAGES, make_pilot_plan, pilot_recipe
from dflashx.plan.plan import make_plan
from dflashx.resolve import resolve
from dflashx.resolve.tau import measurable, pilot_tau_every
from dflashx.run.policy import blocking, budget_breaks
from dflashx.targets.facts import facts_for


def _planned(recipe):
    plan = make_plan(recipe, facts_for(recipe.target))
    assert plan.resolved is not None
    return plan


def test_the_resolved_recipe_of_a_plan_is_the_one_resolve_made():
    recipe = tiny_recipe()
    plan = _planned(recipe)
    assert plan.resolved == resolve(recipe, facts_for(recipe.target))  # nothing written back after resolve
    assert plan.resolved.stages.train.tau_every is None  # the recipe's: the planner derives it
    derived = next(t for t in plan.terms if t.key == "train.tau_seconds").inputs["tau_every"]
    assert plan.stage("train").tau_every == derived >= 1
    assert {s.name for s in plan.stages if s.tau_every is not None} == {"train"}
    assert type(plan).from_json(plan.to_json()).stage("train").tau_every == derived  # plan.json keeps it


def test_the_pilots_plan_holds_its_recipe_its_stages_and_its_limits():
    recipe = tiny_recipe(pilot__prompts=12, pilot__train_steps=6, pilot__max_minutes=5.0)
    run = _planned(recipe).resolved
    pilot = make_pilot_plan(recipe, run, start=20)
    scratch = pilot_recipe(recipe, measurable(run.stages.train), 20)
    assert pilot.resolved == resolve(scratch, run.target.facts)  # its own recipe, resolved once
    generate, train = pilot.resolved.stages.generate, pilot.resolved.stages.train
    assert (generate.max_prompts, generate.max_minutes) == (32, 5.0)  # 12 more than the 20 already there
    assert (train.max_steps, train.checkpoint_every, train.keep_checkpoints) == (6, 6, 1)
    assert train.tau_every == pilot.stage("train").tau_every == pilot_tau_every(None, True, 6) == 2
    assert [s.name for s in pilot.stages if s.enabled] == list(PILOT_STAGES)
    assert pilot.resolved.tracking.mode == "disabled"
    for name in STAGE_ORDER:  # the estimates are the pilot's: its disabled stages cost nothing
        if name not in PILOT_STAGES:
            assert pilot.stage(name).estimates.seconds == 0
    full = _planned(recipe)
    assert pilot.stage("train").estimates.seconds < full.stage("train").estimates.seconds


def test_a_pilot_measures_no_tau_where_the_recipe_turns_it_off_or_nothing_can_be_measured():
    recipe = tiny_recipe(stages__train__tau_every=0)
    assert make_pilot_plan(recipe, _planned(recipe).resolved, 0).stage("train").tau_every == 0
    held_none = tiny_recipe(dataset__eval_holdout=0)
    assert make_pilot_plan(held_none, _planned(held_none).resolved, 0).stage("train").tau_every == 0


def test_only_budget_errors_pass_and_only_when_asked():
    plan = make_plan(seeds_recipe(budget__max_usd=1), facts_for(seeds_recipe().target))
    assert [f.code for f in plan.errors] == ["budget_usd"]
    assert [f.code for f in blocking(plan, over_budget_ok=False)] == ["budget_usd"]
    assert blocking(plan, over_budget_ok=True) == []
    assert [line.split("]")[0] for line in budget_breaks(plan)] == ["[budget_usd"]
    broken = dataclasses.replace(plan, findings=(error("x_code", "stages.x", "broken", "fix"), *plan.findings))
    assert [f.code for f in blocking(broken, over_budget_ok=True)] == ["x_code"]
