"""The held-out τ probe costs what was measured (issue 38): on a GPU its batched decode of a small target is
launch-bound, which the bandwidth model does not price, so the pilot's training measures one probe's seconds,
the re-plan prices the probe with it and derives `tau_every` from it, and the train stage reports the probe's
measured share of the stage."""

from __future__ import annotations

import json
from types import SimpleNamespace

from _plan_recipes import recipe_from

from dflashx.plan.calibration import PilotCalibration, apply_calibration, conditions
from dflashx.plan.plan import make_plan
from dflashx.resolve.tau import TAU_SHARE
from dflashx.run.pilot_measure import probe_seconds, training_stats
from dflashx.stages.train import probe_share


def _planned(recipe):
    plan = make_plan(recipe)
    assert plan.resolved is not None
    terms = {t.key: t for t in plan.terms}
    return plan.stage("train").tau_every, terms


def test_the_pilot_measures_the_median_probe_leaving_the_first_out():
    probes = [{"heldout_tau": 2.0, "heldout_seconds": 3.0}, {"heldout_tau": 2.5, "heldout_seconds": 0.4},
              {"heldout_tau": 3.0, "heldout_seconds": 0.6}, {"heldout_tau": 3.1, "heldout_seconds": 0.5}]
    assert probe_seconds(probes) == 0.5  # the first pays the decoder's first use
    assert probe_seconds(probes[:1]) == 3.0 and probe_seconds([]) is None
    windows = [{"mfu": 0.1, "tokens_per_s": 10.0, "tflops": 1.0, "flops_per_step": 1e12, "step": 10}] * 3
    assert training_stats(windows, 1, probes)["tau_probe_s"] == 0.5


def test_the_re_plan_prices_the_probe_as_measured_and_sizes_tau_every_from_it():
    recipe = recipe_from("tiny.yaml", "h200_x1")
    _, terms = _planned(recipe)
    bandwidth_model = terms["train.tau_probe_seconds"].value
    cal = PilotCalibration(run_id="r", run_dir="/r", measured_at="now", conditions=conditions(recipe), stats={},
                           training_mfu=0.002, tau_probe_seconds=0.05)
    calibrated, report = apply_calibration(recipe, cal)
    assert report.applied["hardware.calibrated.tau_probe_seconds"] == 0.05
    after, terms = _planned(calibrated)
    probe, rest = terms["train.tau_probe_seconds"], terms["train.tau_seconds"]
    assert probe.value == 0.05 and probe.inputs["calibrated"] is True and bandwidth_model < 0.05
    assert after > 0
    assert rest.inputs["share_of_rest"] <= TAU_SHARE  # the probes the re-plan keeps cost at most the share
    dearer = PilotCalibration(**{**cal.model_dump(), "tau_probe_seconds": 0.4})  # one probe over 5%: none
    assert _planned(apply_calibration(recipe, dearer)[0])[0] == 0
    other = recipe_from("tiny.yaml", "h200_x1", drafter__num_layers=2)  # another drafter: not applied
    _, skipped = apply_calibration(other, cal)
    assert "hardware.calibrated.tau_probe_seconds" not in skipped.applied


def test_the_train_stage_reports_the_probes_measured_share(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    rows = [{"step": 10, "loss": 1.0}, {"step": 10, "heldout_tau": 2.0, "heldout_seconds": 1.5},
            {"step": 20, "heldout_tau": 2.5, "heldout_seconds": 0.5}]
    (logs / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ctx = SimpleNamespace(out_dir=tmp_path)
    assert probe_share(ctx, 100.0) == {"tau_probe_seconds": 2.0, "tau_probe_share": 0.02}
    (logs / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert probe_share(ctx, 100.0) == {}  # nothing measured
