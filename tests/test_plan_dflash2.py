"""DFlash2 in the planner: parameters (the codebooks' 127M), FLOPs, memory, the expected speed-up from
the published DFlash2 figure, its rules, and `dflashx plan ... drafter.architecture=dflash2 --explain`."""

from __future__ import annotations

import json

import pytest
from _plan_recipes import REPO, seeds_recipe
from typer.testing import CliRunner

from dflashx.cli.main import app
from dflashx.plan.plan import make_plan
from dflashx.resolve.flops import dflash2_layer_flops_per_token, drafter_step_flops, selector_flops_per_slot
from dflashx.resolve.model_states import model_state_bytes, state_bytes, zero_model_state_bytes
from dflashx.resolve.resolve import resolve as resolve_with
from dflashx.resolve.speculative import DFLASH2_B8, geometric_profile
from dflashx.targets.registry import lookup

SEEDS = str(REPO / "recipes" / "qwen36_27b.yaml")
V, R, H = 248_320, 256, 5120


def resolve(recipe):
    return resolve_with(recipe, lookup("Qwen/Qwen3.6-27B"))


def dims(**overrides):
    return resolve(seeds_recipe(drafter__architecture="dflash2", **overrides)).drafter.dims


def plan_json(**overrides):
    return make_plan(seeds_recipe("b200_nvl8", **overrides)).to_json()


def test_qwen36_dflash2_parameters():
    d2, d1 = dims(), resolve(seeds_recipe(drafter__architecture="dflash")).drafter.dims
    assert d2.codebook_params == 2 * V * R == 127_139_840
    # per layer two convolutions: Linear(h -> 2 K h/16) and base [2, K, h], K = 2
    assert d2.conv_params == 5 * 2 * (H * 2 * 2 * H // 16 + 2 * 2 * H)
    assert d2.trainable == d1.trainable + d2.conv_params + d2.codebook_params + H * R
    assert d2.adamw_params == d1.adamw_params + d2.codebook_params + 5 * 2 * 2 * 2 * H  # + codebooks, base kernels


def test_dflash2_flops_add_convolutions_and_selector_only():
    d2, d1 = dims(), resolve(seeds_recipe(drafter__architecture="dflash")).drafter.dims
    args = (8192.0, 3000.0, 1e7, 8192.0 * 15 / 16)
    extra = drafter_step_flops(d2, *args) - drafter_step_flops(d1, *args)
    # per token and layer: two convolutions, each a projection h -> 2 K h/16 and 2 sides x 2 K h, K = 2
    conv = 2 * (2.0 * H * 2 * 2 * H // 16 + 2 * (2.0 * 2 * H))
    select = 2.0 * H * R + R + 2.0 * 16 * R + 16
    assert dflash2_layer_flops_per_token(d2) == conv and selector_flops_per_slot(d2) == select
    assert extra == pytest.approx(3 * (5 * 8192 * conv + args[3] * select))
    assert dflash2_layer_flops_per_token(d1) == selector_flops_per_slot(d1) == 0


def test_muon_steps_codebooks_with_adamw_bytes():
    d = dims()
    muon = model_state_bytes(d.trainable, d.adamw_params, "bf16", "fp32", "muon", 2, 8)
    expected = (zero_model_state_bytes(d.trainable - d.adamw_params, 2, 8, state_bytes("bf16", "fp32", "muon", 2))
                + zero_model_state_bytes(d.adamw_params, 2, 8, state_bytes("bf16", "fp32", "adamw", 2)))
    assert muon == expected
    adamw = model_state_bytes(d.trainable, d.adamw_params, "bf16", "fp32", "adamw", 2, 8)
    assert adamw == zero_model_state_bytes(d.trainable, 2, 8, state_bytes("bf16", "fp32", "adamw", 2))


def test_expected_tau_from_the_published_dflash2_figure():
    recipe = resolve(seeds_recipe(drafter__architecture="dflash2", drafter__block_size=8))
    assert recipe.deploy.expected_tau == pytest.approx(5.46)  # the model card's block-8 figure
    assert "Qwen3.8-27B-DFlash2" in recipe.deploy.tau_source and "#1014" in recipe.deploy.tau_source
    alpha = geometric_profile(DFLASH2_B8.figures[0], 7)[0]
    b16 = resolve(seeds_recipe(drafter__architecture="dflash2"))
    assert b16.deploy.acceptance == pytest.approx([alpha**k for k in range(1, 16)])
    dflash = resolve(seeds_recipe(drafter__architecture="dflash"))
    assert b16.deploy.expected_tau > dflash.deploy.expected_tau  # above DFlash's 6.36
    given = resolve(seeds_recipe(drafter__architecture="dflash2", deploy__expected_tau=4.0))
    assert given.deploy.expected_tau == 4.0 and given.deploy.tau_source.startswith("deploy.expected_tau")


def test_dflash2_plan_counts_codebooks_in_memory_storage_and_serving():
    one, two = plan_json(drafter__architecture="dflash"), plan_json(drafter__architecture="dflash2")
    assert two["errors"] == [] and one["errors"] == []
    export = {s["name"]: s["estimates"]["storage_bytes"] for s in two["stages"]}["export"]
    d = resolve(seeds_recipe("b200_nvl8", drafter__architecture="dflash2")).drafter.dims
    assert export == d.trainable * 2
    row1, row2 = one["deploy"]["rows"][0], two["deploy"]["rows"][0]
    assert row2["draft_s"] > row1["draft_s"]  # the convolutions, the selector and the codebook rows
    assert row2["speedup"] > row1["speedup"]  # a higher expected tau for a slightly longer cycle


@pytest.mark.parametrize(("overrides", "code", "key", "severity"), [
    ({"drafter__architecture": "dflash2", "drafter__conv_group_size": 48}, "dflash2_group_size",
     "drafter.conv_group_size", "error"),
    ({"drafter__architecture": "dflash2", "drafter__selector_top_k": 300_000}, "dflash2_top_k",
     "drafter.selector_top_k", "error"),
    ({"drafter__architecture": "dflash2", "drafter__conv_kernel_size": 16}, "dflash2_kernel_block",
     "drafter.conv_kernel_size", "warning"),
    ({"drafter__architecture": "dflash", "drafter__selector_rank": 128}, "dflash2_keys_unused",
     "drafter.selector_rank", "warning"),
    ({"drafter__architecture": "dflash2", "drafter__precision": "fp8", "drafter__selector_rank": 200},
     "dflash2_fp8_bf16", "drafter.selector_rank", "warning"),
])
def test_dflash2_rules(overrides, code, key, severity):
    plan = plan_json(**overrides)
    found = {f["code"]: f for f in plan["errors"] + plan["warnings"]}
    assert code in found, list(found)
    assert found[code]["key"] == key and found[code]["severity"] == severity and found[code]["fix"]


def test_published_dflash2_keys_raise_nothing():
    plan = plan_json(drafter__architecture="dflash2", drafter__precision="fp8")
    assert not [f for f in plan["errors"] + plan["warnings"] if f["code"].startswith("dflash2")]


def test_explain_shows_the_dflash2_drafter():
    result = CliRunner().invoke(app, ["plan", SEEDS, "drafter.architecture=dflash2", "--json", "--explain"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    terms = {t["key"]: t for t in data["explain"]}
    params = terms["train.drafter_params"]
    # the formulas are generated from the expressions (issue 39): DFlash2's parts are their operands and inputs
    assert params["inputs"]["codebook_params"] == 127_139_840 and params["formula"] == "matrices + adamw_params"
    assert params["value"] == params["inputs"]["matrices"] + params["inputs"]["adamw_params"]
    assert terms["train.flops_per_sample"]["inputs"]["selector_flops_per_slot"] > 0
    assert "codebooks" in terms["train.peak_memory"]["source"]
    assert "Qwen3.8-27B-DFlash2" in terms["deploy.speedup"]["source"]
    human = CliRunner().invoke(app, ["plan", SEEDS, "drafter.architecture=dflash2", "--explain"])
    assert "train.drafter_params" in human.stdout and "127139840" in human.stdout.replace(",", "")
