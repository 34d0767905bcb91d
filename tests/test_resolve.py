"""`resolve`: the layer spread, loss γ, batch arithmetic and every other derived value, computed
once and the same wherever it is read (plan, trainer, drafter config, export)."""

from __future__ import annotations

from itertools import pairwise

import pytest
from _plan_recipes import seeds_recipe, tiny_recipe

from dflashx.dflash.config import DFlashConfig
from dflashx.plan.plan import make_plan
from dflashx.resolve import ResolvedRecipe, resolve
from dflashx.resolve.formulas import loss_gamma, spread_layer_ids
from dflashx.targets.registry import lookup


@pytest.mark.parametrize(("layers", "k", "ids"), [
    (64, 5, [1, 16, 31, 46, 61]),
    (36, 5, [1, 9, 17, 25, 33]),
    (6, 2, [1, 3]),  # tiny target: formula range 1..N-3 still holds k layers
    (6, 4, [0, 2, 3, 5]),  # 1..3 holds only 3: widen to every layer
    (4, 4, [0, 1, 2, 3]),
    (64, 1, [32]),  # k = 1: the middle layer N // 2, as the z-lab reference
    (30, 5, [1, 8, 14, 20, 27]),  # half to even, as the reference rounds (20.5 -> 20)
])
def test_spread_layer_ids(layers, k, ids):
    assert spread_layer_ids(layers, k) == ids


@pytest.mark.parametrize("layers", range(2, 70))
def test_spread_is_inside_and_increasing_whenever_possible(layers):
    for k in range(1, layers + 1):
        ids = spread_layer_ids(layers, k)
        assert len(ids) == k and all(0 <= i < layers for i in ids)
        assert all(b > a for a, b in pairwise(ids))


def test_loss_gamma_points_and_rule_between():
    assert (loss_gamma(16), loss_gamma(10), loss_gamma(8)) == (7.0, 5.0, 4.0)
    assert loss_gamma(9) == 4.5 and loss_gamma(13) == 6.0  # linear between the published points
    assert loss_gamma(2) == 1.0  # clamped
    values = [loss_gamma(b) for b in range(2, 33)]
    assert values == sorted(values)


def test_resolved_fills_every_derived_value():
    resolved = make_plan(seeds_recipe(drafter__mask_token_id=None)).to_json()["resolved"]
    assert resolved["drafter"]["target_layer_ids"] == [1, 16, 31, 46, 61]
    assert resolved["drafter"]["mask_token_id"] == 248_070  # from the target facts
    train = resolved["stages"]["train"]
    assert (train["micro_batch"], train["zero_stage"], train["grad_accum"]) == (1, 2, 16)  # 64 / (1 x 4)
    assert (train["loss_gamma"], train["max_length"]) == (7.0, 3072)
    assert resolved["target"]["facts"]["num_layers"] == 64
    assert resolved["hardware"]["gpu"]["memory_gb"] == 102.6 and resolved["hardware"]["gpus_per_node"] == 4
    # plan.json reads back
    assert ResolvedRecipe.model_validate(resolved).drafter.target_layer_ids == [1, 16, 31, 46, 61]


def test_recipe_values_win_over_defaults():
    r = seeds_recipe(drafter__target_layer_ids=[2, 10, 20, 30, 40], stages__train__micro_batch=2,
                     stages__train__zero_stage=1, stages__train__loss_gamma=3.0, stages__train__max_length=2048)
    resolved = make_plan(r).to_json()["resolved"]
    assert resolved["drafter"]["target_layer_ids"] == [2, 10, 20, 30, 40]
    train = resolved["stages"]["train"]
    assert (train["micro_batch"], train["zero_stage"], train["grad_accum"]) == (2, 1, 8)
    assert (train["loss_gamma"], train["max_length"]) == (3.0, 2048)


def test_tiny_recipe_resolves_on_the_builtin_target():
    plan = make_plan(tiny_recipe())
    resolved = plan.to_json()["resolved"]
    assert resolved["drafter"]["target_layer_ids"] == [1, 3]
    assert resolved["drafter"]["mask_token_id"] == 5
    assert resolved["stages"]["train"]["loss_gamma"] == 4.0
    assert plan.errors == []


def _facts(layers: int):
    return lookup("builtin:tiny-qwen3").model_copy(
        update={"num_layers": layers, "layer_types": ["full_attention"] * layers})


def _target_config(layers: int) -> dict:
    f = lookup("builtin:tiny-qwen3")
    return {"num_hidden_layers": layers, "hidden_size": f.hidden_size, "num_attention_heads": f.num_attention_heads,
            "num_key_value_heads": f.num_kv_heads, "head_dim": f.head_dim, "intermediate_size": f.intermediate_size,
            "vocab_size": f.vocab_size}


@pytest.mark.parametrize("layers", range(2, 129))
def test_plan_drafter_and_export_agree_on_layers_and_gamma(layers):
    """For every N in 2..128, k in 1..8 and B in 2..64 the plan's values are what the drafter's
    config and its exported config.json carry: one function, read from both ends."""
    base = tiny_recipe()
    for k in range(1, 9):
        block = 2 + (layers * 8 + k) % 63  # every block size 2..64 is met across the sweep
        recipe = base.model_copy(update={"drafter": base.drafter.model_copy(
            update={"num_target_layers": k, "block_size": block})})
        resolved = resolve(recipe, _facts(layers))
        planned = make_plan(recipe, _facts(layers)).to_json()["resolved"]
        ids = spread_layer_ids(layers, k)
        assert planned["drafter"]["target_layer_ids"] == resolved.drafter.target_layer_ids == ids
        assert planned["stages"]["train"]["loss_gamma"] == resolved.stages.train.loss_gamma == loss_gamma(block)
        if len(set(ids)) == k and max(ids) < layers:  # a spread the plan accepts (k <= N)
            exported = DFlashConfig.from_target(resolved.drafter, _target_config(layers)).to_hf_dict()
            assert exported["dflash_config"]["target_layer_ids"] == ids and exported["block_size"] == block


def test_batch_arithmetic_follows_the_world_size():
    one = resolve(seeds_recipe("h200_x1"), lookup("Qwen/Qwen3.6-27B")).stages.train
    eight = resolve(seeds_recipe("h200_x8"), lookup("Qwen/Qwen3.6-27B")).stages.train
    assert one.deepspeed_config["train_batch_size"] == eight.deepspeed_config["train_batch_size"] == 64
    assert (one.grad_accum, eight.grad_accum, one.world_size, eight.world_size) == (64, 8, 1, 8)
    assert eight.launch_argv[:3] == ["deepspeed", "--num_gpus", "8"]


def test_fp16_target_trains_the_drafter_in_bf16_as_the_plan_shows():
    r = resolve(seeds_recipe(target__precision="fp16"), lookup("Qwen/Qwen3.6-27B"))
    assert r.stages.train.precision == "bf16" and r.stages.train.deepspeed_config["bf16"] == {"enabled": True}
    assert r.target.load_precision == "fp16"
    cpu = resolve(tiny_recipe(target__precision="bf16"), lookup("builtin:tiny-qwen3"))
    assert (cpu.stages.train.precision, cpu.target.load_precision) == ("fp32", "fp32")


def test_speed_switches_resolve_once_by_the_hardware():
    """`auto` compiles when it pays and takes liger on a GPU profile, neither on CPU; explicit values pass through;
    bf16 master weights reach the DeepSpeed config only where training runs in bf16."""
    gpu = resolve(seeds_recipe("h200_x1", stages__train__loss="decay_ce"), lookup("Qwen/Qwen3.6-27B"))
    cpu = resolve(tiny_recipe(), lookup("builtin:tiny-qwen3"))
    assert (gpu.stages.train.compile, gpu.stages.train.loss_kernel) == ("when_it_pays", "liger")
    assert (cpu.stages.train.compile, cpu.stages.train.loss_kernel) == ("off", "torch")
    assert gpu.drafter.precision == "bf16" and gpu.stages.train.master_weights == "fp32"
    assert gpu.stages.train.deepspeed_config["bf16"] == {"enabled": True}
    chosen = resolve(seeds_recipe("h200_x1", stages__train__compile=False, stages__train__loss_kernel="torch",
                                  stages__train__master_weights="bf16", stages__train__zero_stage=2,
                                  drafter__precision="fp8"), lookup("Qwen/Qwen3.6-27B"))
    train = chosen.stages.train
    assert (train.compile, train.loss_kernel, chosen.drafter.precision) == ("off", "torch", "fp8")
    assert chosen.stages.train.deepspeed_config["bf16"] == {
        "enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    cpu_bf16_master = resolve(tiny_recipe(stages__train__master_weights="bf16"), lookup("builtin:tiny-qwen3"))
    assert cpu_bf16_master.stages.train.deepspeed_config["bf16"] == {"enabled": False}
    assert ResolvedRecipe.model_validate_json(chosen.model_dump_json()) == chosen  # round-trips through plan.json


def test_a_value_that_cannot_be_resolved_names_its_key():
    plan = make_plan(seeds_recipe(drafter__mask_token_id=None), lookup("Qwen/Qwen3.6-27B").model_copy(
        update={"mask_token_id": None}))
    assert plan.resolved is None
    assert [(f.code, f.key) for f in plan.errors] == [("mask_token_unknown", "drafter.mask_token_id")]


def test_resolved_recipe_is_frozen():
    r = resolve(tiny_recipe(), lookup("builtin:tiny-qwen3"))
    with pytest.raises(Exception, match="frozen"):
        r.stages.train.loss_gamma = 1.0


def test_objective_and_optimizer_resolve_once():
    """D-PACE takes the torch loss under `auto` (liger takes one weight per call); Muon's rate is lr x the
    factor unless given, null under AdamW; the DeepSpeed config names Muon and drops clipping under it."""
    from dflashx.resolve.formulas import MUON_LR_FACTOR

    facts = lookup("Qwen/Qwen3.6-27B")
    dpace = resolve(seeds_recipe("h200_x1", stages__train__loss="dpace", stages__train__optimizer="muon",
                                 stages__train__muon_lr=None), facts)
    train = dpace.stages.train
    assert train.loss_kernel == "torch" and train.muon_lr == pytest.approx(MUON_LR_FACTOR * train.lr)
    assert train.deepspeed_config["optimizer"]["type"] == "Muon" and train.deepspeed_config["gradient_clipping"] == 0
    assert train.deepspeed_config["optimizer"]["params"]["momentum"] == train.muon_momentum
    adamw = resolve(seeds_recipe("h200_x1", stages__train__loss="decay_ce", stages__train__optimizer="adamw"), facts)
    assert adamw.stages.train.loss_kernel == "liger" and adamw.stages.train.muon_lr is None
    assert adamw.stages.train.deepspeed_config["optimizer"]["type"] == "AdamW"
    assert adamw.stages.train.deepspeed_config["gradient_clipping"] == adamw.stages.train.grad_clip
    given = resolve(seeds_recipe("h200_x1", stages__train__optimizer="muon", stages__train__muon_lr=2e-3), facts)
    assert given.stages.train.muon_lr == 2e-3
    assert ResolvedRecipe.model_validate_json(dpace.model_dump_json()) == dpace


def test_target_labels_count_the_whole_target_and_its_head_in_the_plan():
    """One FLOP model: `labels: target` runs every target layer and the LM head on the supervised
    positions; the planner's FLOPs per sample grow by exactly that, the drafter's part not at all."""
    from dflashx.plan.estimates.training import flops_per_sample
    from dflashx.resolve.flops import target_forward_flops

    facts = lookup("Qwen/Qwen3.6-27B")
    data = resolve(seeds_recipe("h200_x1", stages__train__labels="data"), facts)
    target = resolve(seeds_recipe("h200_x1", stages__train__labels="target"), facts)
    prompt, outputs = 300.0, [1000.0, 2500.0]
    (t_data, d_data, _), (t_target, d_target, _) = (flops_per_sample(r, prompt, outputs) for r in (data, target))
    lengths = [prompt + o for o in outputs]
    deepest = max(data.drafter.target_layer_ids)
    extra = (target_forward_flops(facts, facts.num_layers - 1, lengths) - target_forward_flops(facts, deepest, lengths)
             + 2.0 * facts.hidden_size * facts.vocab_size * sum(outputs)) / len(outputs)
    assert d_target == d_data and t_target - t_data == pytest.approx(extra, rel=1e-9) and extra > 0
