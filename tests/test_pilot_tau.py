"""The pilot's held-out τ curve (issue 31): its interval over the pilot's steps, carried by `PilotCalibration`
as a measurement (no recipe value replaced), handed to the rules through `make_plan(..., calibration)`, and
read by `train_too_short`: a curve still rising at the pilot's last step on a run no longer than the pilot
is a finding with the figures; a flat curve, a longer run, other training values or no curve change nothing.
The trainer's windows leave the measurements' time out (the pilot's MFU reads them)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _plan_recipes import tiny_recipe

from dflashx.config.schema import Recipe
from dflashx.dflash import window as window_module
from dflashx.resolve.tau import TauPoint
from dflashx.dflash.window import Window
from dflashx.plan.calibration import CalibrationReport, PilotCalibration, conditions
from dflashx.plan.plan import Plan, make_plan
from dflashx.plan.rules_training import RISING_MARGIN, still_rising
from dflashx.resolve.tau import PILOT_TAU_POINTS, measurements, pilot_tau_every
from dflashx.targets.facts import facts_for

PILOT_STEPS = 200
RISING = [(50, 2.0), (100, 2.5), (150, 2.8), (200, 3.1)]
FLAT = [(50, 2.0), (100, 2.7), (150, 2.8), (200, 2.82)]  # 0.7% above the best before: levelled off


def _curve(points: list[tuple[int, float]]) -> list[TauPoint]:
    return [TauPoint(step=s, tau=t) for s, t in points]


def _calibration(recipe: Recipe, points: list[tuple[int, float]]) -> PilotCalibration:
    """A pilot's calibration measured under `recipe`'s values, with only a τ curve (and no other figure)."""
    return PilotCalibration(run_id="pilot-run", run_dir="/runs/pilot-run", measured_at="2026-12-01T00:00:00Z",
                            conditions=conditions(recipe), stats={}, tau_curve=_curve(points))


def _plan(recipe: Recipe, cal: PilotCalibration | None) -> Plan:
    return make_plan(recipe, facts_for(recipe.target), cal)


def _findings(plan: Plan) -> dict[str, dict[str, Any]]:
    return {f.code: f.to_json() for f in plan.findings}


def test_the_pilots_interval_measures_a_few_points_ending_at_its_last_step():
    assert pilot_tau_every(None, True, 200) == 50 and measurements(200, 50) == PILOT_TAU_POINTS  # 50 .. 200
    assert pilot_tau_every(1000, True, 200) == 50  # the full run's interval is sized for the full run
    assert pilot_tau_every(None, True, 50) == 13 and measurements(50, 13) == PILOT_TAU_POINTS  # 13, 26, 39, 50
    assert pilot_tau_every(None, True, 6) == 2 and measurements(6, 2) == 3
    assert pilot_tau_every(0, True, 200) == 0  # the recipe turned τ off
    assert pilot_tau_every(None, False, 200) == 0  # no held-out prompts, or a ZeRO-3 target


def test_rising_means_the_last_point_beats_the_best_before_by_the_margin():
    assert still_rising(tuple(_curve(RISING)))
    assert not still_rising(tuple(_curve(FLAT)))
    best = 2.8
    assert not still_rising(tuple(_curve([(1, best), (2, best * (1 + RISING_MARGIN))])))  # not more than
    assert still_rising(tuple(_curve([(1, best), (2, best * (1 + RISING_MARGIN) + 1e-6)])))
    assert not still_rising(tuple(_curve([(1, 2.0), (2, 3.0), (3, 2.9)])))  # fell at the end
    assert not still_rising(tuple(_curve([(200, 3.1)])))  # one point is no curve
    assert not still_rising(())


def test_a_curve_still_rising_at_the_pilots_end_flags_a_run_no_longer_than_the_pilot():
    recipe = tiny_recipe(stages__train__max_steps=150)
    assert "train_too_short" not in _findings(_plan(recipe, None))  # 150 steps: the tiny run's needs are met

    plan = _plan(recipe, _calibration(recipe, RISING))
    finding = _findings(plan)["train_too_short"]
    assert finding["severity"] == "warning" and finding["key"] == "stages.train.epochs"
    message = finding["message"]
    assert "still rising at its last step (step 100: 2.50, step 150: 2.80, step 200: 3.10" in message
    assert "more than 2% above its best before" in message
    assert "the run plans 150 optimizer steps against the pilot's 200" in message
    assert "tiny run needed" not in message  # the measured reason only
    assert "well past the pilot's 200 steps" in finding["fix"]
    assert plan.calibration is not None and list(plan.calibration.tau_curve) == _curve(RISING)
    assert plan.calibration.applied == {}  # a measurement, not a recipe value


def test_a_flat_curve_or_a_longer_run_is_no_finding():
    recipe = tiny_recipe(stages__train__max_steps=150)
    assert "train_too_short" not in _findings(_plan(recipe, _calibration(recipe, FLAT)))
    longer = tiny_recipe(stages__train__max_steps=PILOT_STEPS + 1)  # past where the pilot's τ still rose
    assert "train_too_short" not in _findings(_plan(longer, _calibration(longer, RISING)))


def test_the_measured_reason_joins_the_tiny_runs():
    recipe = tiny_recipe(stages__train__max_steps=60)  # below a quarter of the tiny run's 260 steps
    finding = _findings(_plan(recipe, _calibration(recipe, RISING)))["train_too_short"]
    assert "60 optimizer steps (the tiny run needed 260)" in finding["message"]
    assert "the run plans 60 optimizer steps against the pilot's 200" in finding["message"]
    flat = _findings(_plan(recipe, _calibration(recipe, FLAT)))["train_too_short"]
    no_pilot = _findings(_plan(recipe, None))["train_too_short"]
    assert flat == no_pilot  # as without a pilot


def test_a_curve_measured_under_other_training_values_is_not_read():
    measured = tiny_recipe(stages__train__max_steps=150)
    recipe = tiny_recipe(stages__train__max_steps=150, stages__train__global_batch=16)  # steps of another size
    plan = _plan(recipe, _calibration(measured, RISING))
    assert "train_too_short" not in _findings(plan)
    assert plan.calibration is not None and plan.calibration.tau_curve == ()
    skipped = {n.group: n for n in plan.calibration.not_applied}
    assert skipped["tau"].figures == ("pilot held-out τ curve",)
    assert "stages.train.global_batch" in skipped["tau"].changed


@pytest.mark.parametrize(("key", "value"), [
    ("stages__train__lr", 3e-4), ("stages__train__optimizer", "adamw"), ("stages__train__labels", "target"),
    ("stages__train__loss", "decay_ce"), ("dataset__eval_holdout", 4), ("stages__eval__max_new_tokens", 32)])
def test_a_curve_learnt_or_decoded_otherwise_is_not_read(key, value):
    """The MFU's training group leaves the optimisation, the objective and the held-out slice out; the curve's own
    group holds them: a curve measured under another lr, optimizer, labels, loss or slice is not applied."""
    measured = tiny_recipe(stages__train__max_steps=150)
    kept = _plan(measured, _calibration(measured, RISING))
    assert kept.calibration is not None and kept.calibration.tau_curve == tuple(_curve(RISING))
    assert "train_too_short" in _findings(kept) and not kept.calibration.not_applied
    other = _plan(tiny_recipe(stages__train__max_steps=150, **{key: value}), _calibration(measured, RISING))
    assert other.calibration is not None and other.calibration.tau_curve == ()
    assert "too short for what the pilot measured" not in _findings(other).get("train_too_short", {}).get("message", "")
    skipped = {n.group: n for n in other.calibration.not_applied}
    assert set(skipped) == {"tau"} and skipped["tau"].figures == ("pilot held-out τ curve",)
    assert skipped["tau"].changed


def test_the_curve_round_trips_and_an_older_calibration_has_none():
    recipe = tiny_recipe(stages__train__max_steps=150)
    report = _plan(recipe, _calibration(recipe, RISING)).calibration
    assert report is not None
    data = report.to_json()
    assert data["tau_curve"] == [{"step": s, "tau": t} for s, t in RISING]
    assert CalibrationReport.from_json(data) == report
    del data["tau_curve"]  # plan.json written before the pilot measured τ
    assert CalibrationReport.from_json(data).tau_curve == ()
    older = _calibration(recipe, RISING).model_dump(mode="json")
    del older["tau_curve"]  # calibration.json written before the pilot measured τ
    cal = PilotCalibration.model_validate(older)
    assert cal.tau_curve == [] and "train_too_short" not in _findings(_plan(recipe, cal))


def test_a_paused_window_leaves_the_measurements_time_out(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(window_module.time, "perf_counter", lambda: now[0])
    window = Window(block_size=4, peak_flops=1e12, world=1, micro_per_step=1)

    def step() -> None:
        window.add(torch.tensor(1.0), torch.ones(4), torch.ones(4), tokens=100.0, flops=1e12)
        now[0] += 1.0

    step()
    with window.paused():
        now[0] += 30.0  # a held-out τ measurement
    step()
    figures = window.read(1e-3)
    assert figures["tokens_per_s"] == pytest.approx(100.0) and figures["mfu"] == pytest.approx(1.0)
