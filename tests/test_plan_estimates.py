"""Estimate formulas: ZeRO memory against DeepSpeed's estimator, calibration, storage, cost, totals."""

from __future__ import annotations

import pytest
from _plan_recipes import seeds_recipe, tiny_recipe

from dflashx.plan.context import build_context
from dflashx.resolve import resolve
from dflashx.resolve.model_states import state_bytes, zero_model_state_bytes
from dflashx.plan.estimates.training import sample_lengths
from dflashx.plan.plan import make_plan
from dflashx.resolve.flops import target_forward_flops
from dflashx.targets.registry import lookup

QWEN36 = lookup("Qwen/Qwen3.6-27B")


def ctx(hardware: str = "rtx_pro_6000_x4", **overrides):
    return build_context(resolve(seeds_recipe(hardware, **overrides), QWEN36))


def term(terms, key):
    return next(t for t in terms if t.key == key)


@pytest.mark.parametrize("gpus", [1, 4, 8])
def test_zero_formulas_match_deepspeeds_estimators(gpus):
    from deepspeed.runtime.zero.stage_1_and_2 import (
        estimate_zero2_model_states_mem_needs,
    )

    params = 1_835_008_000
    mixed = state_bytes("bf16", "fp32", "adamw", 2)  # what DeepSpeed's estimators assume: bf16 + fp32 master, Adam
    _, ds2 = estimate_zero2_model_states_mem_needs(params, num_gpus_per_node=gpus, cpu_offload=False)
    assert zero_model_state_bytes(params, 2, gpus, mixed) == pytest.approx(ds2, abs=1)
    # more partitioning never needs more memory
    per_stage = [zero_model_state_bytes(params, s, gpus, mixed) for s in range(3)]
    assert per_stage == sorted(per_stage, reverse=True)


def test_calibrated_serving_ratio_scales_the_prediction():
    base = ctx()
    calibrated = ctx(hardware__calibrated={"serving_ratio": 0.5})
    assert calibrated.generation.tokens_per_second == pytest.approx(base.generation.tokens_per_second / 2)
    used = term(calibrated.generation.terms, "generate.tokens_per_second").inputs
    assert used["calibration"] == 0.5 and used["calibrated"] is True and "measured" in used["calibration_source"]
    plain = term(base.generation.terms, "generate.tokens_per_second").inputs
    assert plain["calibration"] == 1.0 and plain["calibrated"] is False


def test_calibrated_mfu_replaces_the_table_row_and_includes_the_gradient_sync():
    base, fast = ctx(), ctx(hardware__calibrated={"training_mfu": 0.8})
    b = term(base.training.terms, "train.seconds").inputs
    f = term(fast.training.terms, "train.seconds").inputs
    assert f["compute_s"] == pytest.approx(b["compute_s"] * b["mfu"] / 0.8)
    assert b["grad_sync_s"] > 0 and f["grad_sync_s"] == 0  # a measured MFU already includes it
    # nothing but the compute and the held-out τ measurements (not a training step: the MFU does not hold them)
    assert fast.training.seconds == pytest.approx(f["compute_s"] + f["tau_s"]) and f["tau_s"] > 0
    assert not b["calibrated"] and f["calibrated"] and "measured on this node" in f["mfu_source"]


def test_training_flops_follow_the_last_target_layer_and_epochs():
    data = {"stages__train__labels": "data"}  # `target` labels run the target to its head whatever the taps
    early = ctx(drafter__target_layer_ids=[1, 2, 3, 4, 5], **data)
    late = ctx(**data)
    # the target forward stops at the last captured layer: 5 of 64 layers vs 62
    target_early = term(early.training.terms, "train.flops_per_sample").inputs["target"]
    target_late = term(late.training.terms, "train.flops_per_sample").inputs["target"]
    room = 3072 - early.tokens.prompt_mean
    lengths = [early.tokens.prompt_mean + o for o in sample_lengths(early.lengths, room)]
    assert sum(lengths) / len(lengths) == pytest.approx(early.tokens.train_len_mean, rel=0.01)
    assert target_early == pytest.approx(target_forward_flops(QWEN36, 5, lengths) / len(lengths))
    assert target_late == pytest.approx(target_forward_flops(QWEN36, 61, lengths) / len(lengths))
    assert target_early < target_late * QWEN36.params_through_layer(5) / QWEN36.params_through_layer(61) * 1.2
    double = ctx(stages__train__epochs=12, **data)
    assert double.training.flops == pytest.approx(2 * late.training.flops)
    assert double.training.steps == 2 * late.training.steps


def test_storage_formulas():
    c = ctx(stages__train__mode="offline")
    tokens = c.tokens.train_tokens_per_epoch
    assert c.storage.by_artifact["train.hidden_states"] == tokens * 5 * 5120 * 2
    ckpts = -(-c.training.steps // 500)
    params = c.training.drafter.trainable
    assert c.storage.by_artifact["train.checkpoint"] == min(ckpts, 3) * 14 * params  # 2 newest + best, full states
    off = ctx(stages__generate__enabled=False)
    assert "generate.completions" not in off.storage.by_artifact


def test_cost_and_totals():
    plan = make_plan(seeds_recipe()).to_json()
    for s in plan["stages"]:
        e = s["estimates"]
        assert e["gpu_hours"] == pytest.approx(e["seconds"] / 3600 * 4)
        assert e["usd"] == pytest.approx(e["gpu_hours"] * 1.80)
    t = plan["totals"]
    assert t["seconds"] == pytest.approx(sum(s["estimates"]["seconds"] for s in plan["stages"]))
    assert t["peak_gpu_memory_bytes"] == max(s["estimates"]["peak_gpu_memory_bytes"] for s in plan["stages"])
    assert t["days"] == pytest.approx(t["seconds"] / 86_400)


def test_disabled_stage_costs_nothing():
    plan = make_plan(seeds_recipe(stages__generate__enabled=False)).to_json()
    gen = next(s for s in plan["stages"] if s["name"] == "generate")
    assert not gen["enabled"] and set(gen["estimates"].values()) == {0.0}


def test_training_memory_grows_with_micro_batch_and_shrinks_with_zero():
    one, two = ctx(), ctx(stages__train__micro_batch=2)
    act = one.memory["train"].parts["activations"]
    assert two.memory["train"].parts["activations"] == pytest.approx(2 * act)
    z0 = ctx(stages__train__zero_stage=0).memory["train"].parts["drafter_model_states"]
    assert one.memory["train"].parts["drafter_model_states"] < z0
    assert one.memory["train"].bytes < 96e9  # online training fits the seeds' 96 GB GPUs


def test_transformers_backend_batches_by_batch_size():
    c = build_context(resolve(tiny_recipe(), lookup("builtin:tiny-qwen3")))
    assert c.generation.serving.batch == 32 and c.generation.seconds > 0


def test_fp8_serving_quantizes_the_decoder_and_raises_the_batch():
    bf16 = ctx(hardware="b200_nvl8")
    fp8 = ctx(hardware="b200_nvl8", stages__generate__serving={"weight_dtype": "fp8"})
    decoder = QWEN36.params_through_layer(QWEN36.num_layers - 1)
    assert bf16.generation.serving.weight_bytes - fp8.generation.serving.weight_bytes == decoder  # 2 -> 1 byte each
    assert fp8.generation.serving.batch > bf16.generation.serving.batch
    assert fp8.generation.tokens_per_second > bf16.generation.tokens_per_second
