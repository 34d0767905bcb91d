"""The planner's held-out τ interval (stages.train.tau_every): derived once from its own train-time
estimate so that the measurements cost at most 5% of it, counted in the train stage's time and shown by
--explain; a recipe's value is kept, 0 turns it off, no held-out prompts or a ZeRO-3 sharded target mean
none."""

from __future__ import annotations

import math

import pytest

from _plan_recipes import seeds_recipe

from dflashx.config.fields import PRECISION_BYTES
from dflashx.config.load import load_recipe
from dflashx.plan.estimates.device import device_of
from dflashx.plan.estimates.host import EVAL_BANDWIDTH_EFFICIENCY
from dflashx.plan.plan import make_plan
from dflashx.resolve.tau import TAU_SHARE, measurements, tau_every
from dflashx.targets.facts import facts_for
from dflashx.targets.registry import lookup


def _plan(*overrides: str):
    recipe = load_recipe("recipes/tiny.yaml", list(overrides)).recipe
    return make_plan(recipe, facts_for(recipe.target))


def _terms(plan):
    return {t.key: t for t in plan.terms}


def test_the_derived_interval_keeps_the_measurements_within_five_percent():
    plan = _plan()
    train, terms = plan.resolved.stages.train, _terms(plan)
    every = plan.stage("train").tau_every  # planned: the resolved recipe keeps the recipe's value (None)
    assert train.tau_every is None
    steps, probe = terms["train.steps"].value, terms["train.tau_probe_seconds"].value
    seconds = terms["train.seconds"]
    assert train.tau_prompts == 8 and train.tau_max_new_tokens == 96  # the eval stage's, under the cap
    assert every >= 1 and seconds.inputs["tau_s"] == measurements(steps, every) * probe > 0
    rest = seconds.value - seconds.inputs["tau_s"]
    assert seconds.inputs["tau_s"] <= TAU_SHARE * rest
    if every > 1:  # the smallest such interval: one step less would measure more than allowed
        assert measurements(steps, every - 1) * probe > TAU_SHARE * rest
    assert terms["train.tau_seconds"].inputs["tau_every"] == every
    stage = next(s for s in plan.to_json()["stages"] if s["name"] == "train")
    assert stage["estimates"]["seconds"] >= seconds.value  # the stage's time counts it (plus its fixed costs)


def test_a_given_interval_is_kept_and_zero_measures_nothing():
    assert _plan("stages.train.tau_every=10").stage("train").tau_every == 10
    off = _plan("stages.train.tau_every=0")
    assert off.stage("train").tau_every == 0 and _terms(off)["train.tau_seconds"].value == 0
    assert _plan("dataset.eval_holdout=0").stage("train").tau_every == 0


def test_a_given_interval_without_held_out_prompts_is_a_warning():
    plan = _plan("stages.train.tau_every=10", "dataset.eval_holdout=0")
    found = [f for f in plan.warnings if f.code == "tau_no_prompts"]
    assert [f.key for f in found] == ["stages.train.tau_every"] and "dataset.eval_holdout" in found[0].fix
    assert not any(f.code == "tau_no_prompts" for f in _plan("stages.train.tau_every=10").findings)
    assert not any(f.code == "tau_no_prompts" for f in _plan("dataset.eval_holdout=0").findings)


@pytest.mark.parametrize(("steps", "train_s", "probe_s", "every"), [
    (320, 100.0, 1.0, 64),  # 5 measurements of 1 s within 5 s
    (320, 100.0, 6.0, 0),  # not even the last step's
    (10, 1e6, 1.0, 1),  # every step is cheap enough
])
def test_tau_every_formula(steps, train_s, probe_s, every):
    assert tau_every(None, True, steps, train_s, probe_s) == every
    if every:
        assert measurements(steps, every) * probe_s <= TAU_SHARE * train_s
    assert tau_every(None, False, steps, train_s, probe_s) == 0 and tau_every(7, True, steps, train_s, probe_s) == 7
    assert math.ceil(steps / max(every, 1)) >= measurements(steps, every)


def test_a_sharded_target_cannot_be_measured_on_rank_0():
    sharded = ("hardware=h200_x8", "stages.train.shard_target=always")
    plan = _plan(*sharded, "stages.train.tau_every=50")
    assert plan.resolved.stages.train.target_sharding == "zero3"
    assert any(f.code == "tau_sharded" and f.key == "stages.train.tau_every" for f in plan.errors)
    assert _plan(*sharded).stage("train").tau_every == 0


@pytest.mark.parametrize("model", ["Qwen/Qwen3-30B-A3B", "Qwen/Qwen3.6-35B-A3B"])
def test_an_moe_probe_reads_the_experts_its_verified_block_touches(model):
    """At τ 1 each output token is a draft-verify cycle whose target forward verifies block_size tokens: an MoE
    target's probe reads the experts all of them touch (several times one token's), plus the drafter's weights."""
    facts = lookup(model)

    def probe(block: int):
        recipe = seeds_recipe("h200_x8", target__model=model, drafter__block_size=block)
        plan = make_plan(recipe)
        return plan.resolved, _terms(plan)["train.tau_probe_seconds"]

    resolved, big = probe(16)
    dtype = resolved.target.load_precision
    expert_bytes = facts.expert_params * PRECISION_BYTES[dtype]
    assert big.inputs["routed_bytes"] == pytest.approx(
        facts.num_moe_layers * facts.expected_experts_touched(16) * expert_bytes)
    assert big.inputs["routed_bytes"] > 5 * facts.num_moe_layers * facts.expected_experts_touched(1) * expert_bytes
    assert big.inputs["drafter_bytes"] > 2 * resolved.drafter.dims.trainable > 0  # 16-bit, its LM head included
    read = big.inputs["dense_bytes"] + big.inputs["routed_bytes"] + big.inputs["drafter_bytes"]
    bandwidth = device_of(resolved.hardware).bandwidth_bps
    assert big.inputs["seconds_per_token"] == pytest.approx(read / (bandwidth * EVAL_BANDWIDTH_EFFICIENCY.value))
    _, small = probe(8)
    assert small.inputs["routed_bytes"] < big.inputs["routed_bytes"] and small.value < big.value


def test_the_batch1_efficiency_is_the_eval_decoders_measured_median():
    """EVAL_BANDWIDTH_EFFICIENCY (what the eval stage and the τ probe are priced at) is the median of the
    measured rows of benchmarks/results/eval_decode.json (the eval stage's SpecDecoder at τ 1 on one H100)."""
    import json
    import statistics
    from pathlib import Path

    rows = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "eval_decode.json")
                      .read_text())["rows"]
    assert all(r["spec"]["cycles"] >= r["tokens"] - 2 for r in rows)  # τ 1: one cycle per token
    assert EVAL_BANDWIDTH_EFFICIENCY.value == pytest.approx(statistics.median(r["spec"]["efficiency"] for r in rows),
                                                            abs=5e-4)
