"""The planner for MoE targets and for a target sharded over the node: issue 23's acceptance
(`dflashx plan recipes/qwen36_27b.yaml target.model=<id> hardware=h200_x8`), the sharding decision
following the train-memory model, the gather traffic in the step time, and MoE FLOPs / decode bytes."""

from __future__ import annotations

import json

import pytest
from _plan_recipes import REPO, seeds_recipe
from typer.testing import CliRunner

from dflashx.cli.main import app
from dflashx.config.fields import PRECISION_BYTES
from dflashx.plan.estimates.decode import dense_read_bytes, flops_per_token
from dflashx.plan.estimates.moe import routed_flops_per_token
from dflashx.plan.plan import make_plan
from dflashx.resolve.flops import target_forward_flops
from dflashx.resolve.memory import largest_gather_bytes, target_weight_bytes
from dflashx.resolve.resolve import resolve
from dflashx.resolve.sharding import longest_sample_bytes
from dflashx.targets.registry import lookup

SEEDS = str(REPO / "recipes" / "qwen36_27b.yaml")
SHARDED = {"Qwen/Qwen3-235B-A22B": True, "openai/gpt-oss-120b": True,
           "Qwen/Qwen3.6-35B-A3B": False, "Qwen/Qwen3-30B-A3B": False}


def _terms(data: dict) -> dict[str, dict]:
    return {t["key"]: t for t in data["explain"]}


@pytest.mark.parametrize("model", sorted(SHARDED))
def test_moe_targets_plan_on_h200_x8(model):
    """Issue 23's acceptance command: known target, training fits; the targets too big for one
    H200 beside the drafter are sharded and their gather traffic is in --explain."""
    result = CliRunner().invoke(app, ["plan", SEEDS, f"target.model={model}", "hardware=h200_x8", "--explain",
                                      "--json"])
    data = json.loads(result.stdout)
    codes = {f["code"] for f in data["errors"]}
    assert not codes & {"unknown_target", "train_memory"}, data["errors"]
    train = data["resolved"]["stages"]["train"]
    facts = lookup(model)
    assert train["target_sharding"] == ("zero3" if SHARDED[model] else "none")
    gather = _terms(data)["train.target_gather_seconds"]
    assert (gather["value"] > 0) == SHARDED[model]
    # the drafter is dense, with the target's hidden size
    drafter = data["resolved"]["drafter"]
    assert drafter["hidden_size"] == facts.hidden_size and drafter["intermediate_size"] == facts.dense_ffn_width > 0
    if SHARDED[model]:
        human = CliRunner().invoke(app, ["plan", SEEDS, f"target.model={model}", "hardware=h200_x8", "--explain"])
        assert "train.target_gather_seconds" in human.stdout and "ZeRO-3" in human.stdout


def test_gather_traffic_is_priced_per_micro_step_and_added_to_the_train_time():
    recipe = seeds_recipe("h200_x8", target__model="openai/gpt-oss-120b", drafter__mask_token_id=None,
                          stages__train__labels="data")  # data labels: the gather stops at the deepest tap
    plan = make_plan(recipe)
    r, facts = plan.resolved, lookup("openai/gpt-oss-120b")
    train = r.stages.train
    terms = {t.key: t for t in plan.terms}
    deepest = max(r.drafter.target_layer_ids)
    gathered = facts.params_through_layer(deepest) + facts.vocab_size * facts.hidden_size
    per_micro = 7 / 8 * gathered * 2 / (450 * 1e9)  # (N-1)/N x bf16 bytes / h200_x8's 450 GB/s
    assert terms["train.target_gather_seconds"].value == pytest.approx(per_micro)
    seconds = terms["train.seconds"]
    assert seconds.inputs["target_gather_s"] == pytest.approx(per_micro * terms["train.steps"].value * train.grad_accum)
    assert seconds.value == pytest.approx(seconds.inputs["compute_s"] + seconds.inputs["grad_sync_s"]
                                          + seconds.inputs["target_gather_s"])


def test_auto_sharding_follows_the_train_memory_model():
    """auto shards only when a whole target per GPU does not fit beside the drafter: the 30B (61 GB
    bf16) fits an H200 whole; forced, it shards, holds 1/8 + two gathered layers, and the micro
    batch rises to the largest divisor of global_batch / 8 that fits."""
    whole = resolve(seeds_recipe("h200_x8", target__model="Qwen/Qwen3-30B-A3B"), lookup("Qwen/Qwen3-30B-A3B"))
    assert whole.stages.train.target_sharding == "none" and whole.stages.train.micro_batch == 1
    facts = lookup("Qwen/Qwen3-30B-A3B")
    recipe = seeds_recipe("h200_x8", target__model="Qwen/Qwen3-30B-A3B", stages__train__shard_target="always")
    forced = resolve(recipe, facts)
    train = forced.stages.train
    assert train.target_sharding == "zero3"
    per_rank = train.global_batch // train.world_size
    gpu = recipe.hardware.gpu.memory_gb * 1e9

    def peak(micro: int) -> float:
        return longest_sample_bytes(recipe, facts, forced.drafter.dims, "bf16", "zero3", 8, train.zero_stage, micro)

    assert peak(train.micro_batch) <= gpu
    assert all(peak(m) > gpu for m in range(train.micro_batch + 1, per_rank + 1) if per_rank % m == 0)
    assert train.micro_batch > 1 and train.grad_accum * train.micro_batch * train.world_size == train.global_batch
    assert target_weight_bytes(facts, "bf16", "zero3", 8) == pytest.approx(
        facts.total_params * 2 / 8 + 2 * largest_gather_bytes(facts, "bf16")
        + 2 * facts.vocab_size * facts.hidden_size * 2)  # + the whole embedding and LM head every rank keeps
    assert largest_gather_bytes(facts, "bf16") == max(facts.layer_params(0), facts.vocab_size * facts.hidden_size) * 2


def test_train_memory_fix_names_sharding_when_the_target_is_whole():
    never = make_plan(seeds_recipe("h200_x8", target__model="Qwen/Qwen3-235B-A22B", drafter__mask_token_id=None,
                                   stages__train__shard_target="never"))
    [finding] = [f for f in never.errors if f.code == "train_memory"]
    assert "stages.train.shard_target" in finding.fix and "node's GPUs" in finding.fix
    one_gpu = make_plan(seeds_recipe("h200_x1", target__model="Qwen/Qwen3-235B-A22B", drafter__mask_token_id=None))
    assert one_gpu.resolved.stages.train.target_sharding == "none"  # nothing to shard over
    [finding] = [f for f in one_gpu.errors if f.code == "train_memory"]
    assert "more GPUs" in finding.fix
    sharded = make_plan(seeds_recipe("h200_x8", target__model="Qwen/Qwen3-235B-A22B", drafter__mask_token_id=None))
    assert sharded.resolved.stages.train.target_sharding == "zero3"
    memory = next(t for t in sharded.terms if t.key == "train.peak_memory")
    assert memory.inputs["target_weights"] < 0.25 * lookup("qwen3-235b-a22b").total_params * 2


def test_moe_flops_count_active_parameters_and_memory_all():
    facts = lookup("Qwen/Qwen3-30B-A3B")
    per_token = target_forward_flops(facts, 20, [1.0])  # one token: no attention pairs beyond itself
    attention = 4 * facts.num_attention_heads * facts.head_dim * 21
    assert per_token - attention == pytest.approx(2 * facts.params_through_layer(20, active=True))
    assert facts.params_through_layer(20, active=True) < facts.params_through_layer(20) / 5
    # the decode roofline counts the FLOPs outside the routed experts; moe.py times those
    assert flops_per_token(facts, 0) + routed_flops_per_token(facts, facts.num_moe_layers) == pytest.approx(
        2 * (facts.active_params - facts.vocab_size * facts.hidden_size - facts.hidden_size))


def test_decode_reads_the_experts_a_batch_touches():
    """E (1 - (1 - k/E)^n): one token reads its k experts per layer, a large batch reads them all;
    a dense target reads the same weights at any batch."""
    moe, dense = lookup("Qwen/Qwen3-30B-A3B"), lookup("Qwen/Qwen3-8B")
    assert moe.expected_experts_touched(1) == pytest.approx(8)
    assert moe.expected_experts_touched(2) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 2))
    assert moe.expected_experts_touched(4096) == pytest.approx(128)
    from dflashx.plan.estimates.device import Device
    from dflashx.plan.estimates.moe import SGLANG_DECODE, moe_layer
    dev = Device("H200", 141e9, 4.8e12, 989e12, 1979e12, 1)
    head = moe.vocab_size * moe.hidden_size * 2
    experts = moe.num_moe_layers * moe.num_experts * moe.expert_params
    # the dense roofline reads every weight but the routed experts; moe_layer reads the touched ones
    assert dense_read_bytes(moe, "bf16") - head == pytest.approx((moe.params_through_layer(47) - experts) * 2)
    assert moe_layer(moe, 1, "bf16", dev, SGLANG_DECODE).weight_bytes == pytest.approx(8 * moe.expert_params * 2)
    assert moe_layer(moe, 4096, "bf16", dev, SGLANG_DECODE).weight_bytes == pytest.approx(
        128 * moe.expert_params * 2, rel=1e-9)
    assert dense_read_bytes(dense, "bf16") == dense.params_through_layer(35) * 2 + dense.vocab_size * 4096 * 2


def test_gpt_oss_experts_are_served_in_mxfp4():
    from dflashx.resolve.serving import served_weight_bytes
    facts = lookup("openai/gpt-oss-120b")
    experts = facts.routed_expert_params
    assert served_weight_bytes(facts, "bf16") == pytest.approx(
        (facts.total_params - experts) * PRECISION_BYTES["bf16"] + experts * 4.25 / 8)
