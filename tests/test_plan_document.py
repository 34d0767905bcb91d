"""plan.json is one typed document: `load_plan(write(plan)) == plan`, and a file that holds no plan is a clear
error naming the file, the key and the fix."""

from __future__ import annotations

import dataclasses
import json

import pytest
from _plan_recipes import recipe_from, seeds_recipe, tiny_recipe

from dflashx.plan.calibration import PilotCalibration, conditions
from dflashx.plan.plan import Plan, PlanFileError, make_plan
from dflashx.run.rundir import load_plan
from dflashx.store.atomic import atomic_write_json


def _written(plan: Plan, tmp_path, explain: bool = False):
    path = tmp_path / "plan.json"
    atomic_write_json(path, plan.to_json(explain=explain))
    return path


@pytest.mark.parametrize("recipe", [tiny_recipe(), recipe_from("qwen36_27b.yaml"),
                                    seeds_recipe("h100_x8", hardware__nodes=2)], ids=["tiny", "qwen36_27b", "2-node"])
def test_load_gives_back_the_plan_that_was_written(recipe, tmp_path):
    plan = make_plan(recipe)
    loaded = load_plan(_written(plan, tmp_path))
    assert loaded == plan
    assert loaded.to_json() == json.loads(json.dumps(plan.to_json()))  # the layout docs/planner.md documents
    assert plan.resolved is not None and plan.ranges and plan.deploy and plan.stage("train").train_launch
    with pytest.raises(dataclasses.FrozenInstanceError):
        loaded.totals = plan.totals  # type: ignore[misc]


def test_explain_and_a_calibration_travel_too(tmp_path):
    recipe = tiny_recipe()
    cal = PilotCalibration(run_id="r", run_dir="d", measured_at="t", conditions=conditions(recipe),
                           stats={"output_tokens_mean": 321.0}, training_mfu=0.2, training_mfu_rse=0.05)
    plan = make_plan(recipe, calibration=cal)
    assert plan.calibration is not None and plan.calibration.applied
    loaded = load_plan(_written(plan, tmp_path, explain=True))
    assert loaded == plan and loaded.calibration == plan.calibration
    assert [t.key for t in loaded.terms] == [t.key for t in plan.terms] and loaded.terms


def test_a_plan_that_stopped_at_resolution_round_trips(tmp_path):
    plan = make_plan(seeds_recipe(target__model="nobody/unknown-model"))
    assert plan.resolved is None and [f.code for f in plan.errors] == ["unknown_target"]
    assert load_plan(_written(plan, tmp_path)) == plan


def test_a_file_that_holds_no_plan_names_the_file_the_key_and_the_fix(tmp_path):
    path = tmp_path / "plan.json"
    data = make_plan(tiny_recipe()).to_json()
    del data["totals"]
    path.write_text(json.dumps(data))
    with pytest.raises(PlanFileError, match=r"plan\.json: key 'totals' is missing.*plan again"):
        load_plan(path)
    path.write_text("{not json")
    with pytest.raises(PlanFileError, match=r"plan\.json: not JSON.*plan again"):
        load_plan(path)
