"""The eval stage's price on a GPU (issue 38): its decoder runs every suite's prompts as one batch per drafter and
setting, and a batch runs until its longest row ends, so the plan counts cycles of the longest rows, each at the
seconds of one batched cycle the pilot's held-out τ measurements measured on this node (before a pilot: the
batch-1 bandwidth bound per cycle). A target whose cache cannot roll rows back (a hybrid) decodes one prompt at a
time and keeps the one-by-one price. Pure planner, and the pilot's reading of its probes' lines."""

from __future__ import annotations

import pytest
from _plan_recipes import recipe_from, seeds_recipe

from dflashx.plan.calibration import PilotCalibration, apply_calibration, conditions
from dflashx.plan.estimates.lengths import OutputLengths
from dflashx.plan.plan import make_plan
from dflashx.run.pilot_measure import cycle_seconds, training_stats


def _eval_term(recipe):
    plan = make_plan(recipe)
    assert plan.resolved is not None
    return plan.resolved, {t.key: t for t in plan.terms}["eval.seconds"]


def test_a_batched_eval_costs_its_longest_rows_cycles():
    resolved, term = _eval_term(recipe_from("tiny.yaml", "h200_x1"))
    ev, inputs = resolved.stages.eval, term.inputs
    rows = 2 * ev.num_prompts  # the tiny recipe's two suites of 16
    assert inputs["rows"] == rows and inputs["sampled_runs"] == ev.sampled_runs == 5
    lengths = OutputLengths.of(resolved.dataset.stats)
    assert inputs["longest_output"] == pytest.approx(min(lengths.quantile(rows / (rows + 1)), ev.max_new_tokens))
    assert inputs["longest_sampled_output"] == pytest.approx(
        min(lengths.quantile(5 * rows / (5 * rows + 1)), ev.max_new_tokens))
    assert inputs["longest_sampled_output"] >= inputs["longest_output"]
    tau = resolved.deploy.expected_tau
    cycles = inputs["longest_output"] / tau + inputs["longest_output"] + inputs["longest_sampled_output"] / tau
    assert inputs["cycles"] == pytest.approx(cycles)
    assert term.value == pytest.approx(cycles * inputs["cycle_s"])
    assert "longest" in term.formula and "cycle_s" in term.formula
    # one prompt after another, every decode to max_new_tokens, would cost the same cycle decodes x max_new times
    assert term.value < ev.decodes * ev.max_new_tokens * inputs["cycle_s"] / 20


def test_the_pilots_cycle_seconds_price_the_eval_and_only_under_its_conditions():
    recipe = recipe_from("tiny.yaml", "h200_x1")
    _, before = _eval_term(recipe)
    cal = PilotCalibration(run_id="r", run_dir="/r", measured_at="now", conditions=conditions(recipe), stats={},
                           training_mfu=0.002, decode_cycle_seconds=0.012)
    calibrated, report = apply_calibration(recipe, cal)
    assert report.applied["hardware.calibrated.decode_cycle_seconds"] == 0.012
    _, after = _eval_term(calibrated)
    assert after.inputs["measured_cycle_s"] == after.inputs["cycle_s"] == 0.012
    assert after.value == pytest.approx(after.inputs["cycles"] * 0.012)
    assert after.inputs["cycles"] == before.inputs["cycles"]  # the measurement prices the cycles, not their count
    other = recipe_from("tiny.yaml", "h200_x1", drafter__num_layers=2)  # another drafter: not applied
    assert "hardware.calibrated.decode_cycle_seconds" not in apply_calibration(other, cal)[1].applied


def test_a_hybrid_target_keeps_the_one_prompt_at_a_time_price():
    resolved, term = _eval_term(seeds_recipe("b200_nvl8"))
    assert not resolved.target.facts.full_attention_only  # Gated DeltaNet layers
    ev = resolved.stages.eval
    assert term.inputs["tokens"] == ev.decodes * ev.max_new_tokens and "cycles" not in term.inputs


def test_the_pilot_reads_seconds_per_cycle_off_its_probes():
    probes = [{"heldout_tau": 1.5, "heldout_seconds": 3.0, "heldout_decode_cycles": 60},  # the decoder's first use
              {"heldout_tau": 2.0, "heldout_seconds": 0.6, "heldout_decode_cycles": 50},
              {"heldout_tau": 2.5, "heldout_seconds": 0.4, "heldout_decode_cycles": 40},
              {"heldout_tau": 2.8, "heldout_seconds": 0.33, "heldout_decode_cycles": 30}]
    assert cycle_seconds(probes) == pytest.approx(0.011)  # median of 0.012, 0.010, 0.011
    assert cycle_seconds([{"heldout_tau": 2.0, "heldout_seconds": 0.4}]) is None  # a line from before cycles
    windows = [{"mfu": 0.1, "tokens_per_s": 10.0, "tflops": 1.0, "flops_per_step": 1e12, "step": 10}] * 3
    assert training_stats(windows, 1, probes)["decode_cycle_s"] == pytest.approx(0.011)
