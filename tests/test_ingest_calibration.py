"""The ingest stage after a pilot (issue 38): the pilot runs the run's own ingest (to count the prompts), which the
run then skips, so the re-plan's ingest is what the pilot measured, under the data group's conditions (the prompt
sources, de-duplication, hold-out); elsewhere the prompts at the measured rate. Pure planner."""

from __future__ import annotations

import pytest
from _plan_recipes import recipe_from

from dflashx.plan.calibration import PilotCalibration, apply_calibration, conditions
from dflashx.plan.estimates.host import INGEST_PROMPTS_PER_S
from dflashx.plan.plan import make_plan


def _ingest(recipe):
    plan = make_plan(recipe)
    terms = {t.key: t for t in plan.terms}
    fixed = terms["ingest.fixed_seconds"].value if "ingest.fixed_seconds" in terms else 0.0
    return terms["ingest.seconds"], plan.stage("ingest").estimates.seconds, fixed


def test_before_a_pilot_the_prompts_cost_the_measured_rate():
    term, seconds, fixed = _ingest(recipe_from("tiny.yaml", "h200_x1"))
    assert term.inputs["rate"] == INGEST_PROMPTS_PER_S.value
    assert term.value == pytest.approx(term.inputs["raw_prompts"] / INGEST_PROMPTS_PER_S.value)
    assert fixed > 0 and seconds == pytest.approx(term.value + fixed)  # the first stage: the process's imports
    assert INGEST_PROMPTS_PER_S.source in term.source


def test_the_pilots_ingest_is_the_plans_and_only_for_the_same_prompts():
    recipe = recipe_from("tiny.yaml", "h200_x1")
    cal = PilotCalibration(run_id="r", run_dir="/r", measured_at="now", conditions=conditions(recipe), stats={},
                           ingest_seconds=0.011)
    calibrated, report = apply_calibration(recipe, cal)
    assert report.applied["hardware.calibrated.ingest_seconds"] == 0.011
    term, seconds, fixed = _ingest(calibrated)
    assert seconds == 0.011 and fixed == 0.0 and term.inputs == {"measured_s": 0.011} and "pilot" in term.source
    other = recipe_from("tiny.yaml", "h200_x1", dataset__dedupe=False)  # another ingest: the rate prices it
    recalibrated, report = apply_calibration(other, cal)
    assert "hardware.calibrated.ingest_seconds" not in report.applied
    assert [n.changed for n in report.not_applied if n.group == "data"] == [("dataset.dedupe",)]
    assert _ingest(recalibrated)[0].inputs["rate"] == INGEST_PROMPTS_PER_S.value


def test_a_calibration_without_an_ingest_applies_none():
    recipe = recipe_from("tiny.yaml", "h200_x1")
    cal = PilotCalibration(run_id="r", run_dir="/r", measured_at="now", conditions=conditions(recipe),
                           stats={"samples": 284})
    calibrated, report = apply_calibration(recipe, cal)
    assert "hardware.calibrated.ingest_seconds" not in report.applied
    assert "ingest_seconds" not in calibrated.hardware.calibrated
