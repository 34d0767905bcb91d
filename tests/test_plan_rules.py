"""Every planner rule, failing and passing; plus the planner's purity (no I/O, no torch)."""

from __future__ import annotations

import builtins
import socket
import subprocess
import sys

import pytest
from _plan_recipes import REPO, seeds_recipe, tiny_recipe

from dflashx.plan.plan import make_plan
from dflashx.targets.registry import lookup


def codes(recipe, facts=None) -> dict[str, dict]:
    plan = make_plan(recipe, facts).to_json()
    found: dict[str, dict] = {}
    for f in plan["errors"] + plan["warnings"]:
        found.setdefault(f["code"], f)  # the first finding of each code
    return found


def b200(**overrides):
    """The seeds' recipe on b200_nvl8: a plan with no findings at all."""
    return seeds_recipe("b200_nvl8", **overrides)


def test_baseline_has_no_findings():
    found = codes(b200())  # the seeds' 3,072-token training length, acknowledged in the recipe
    assert list(found) == ["train_truncation"] and found["train_truncation"]["severity"] == "warning"
    assert "acknowledged" in found["train_truncation"]["message"]
    assert codes(b200(acknowledge=[], stages__tokenize__max_length=5400)) == {}
    assert codes(tiny_recipe()) == {}


@pytest.mark.parametrize(("overrides", "code", "key", "severity"), [
    ({"stages__generate__serving__dp": 3}, "tp_dp_gpus", "stages.generate.serving.dp", "error"),
    ({"hardware__gpu__memory_gb": 30, "stages__generate__serving__weight_dtype": "fp8",
      "stages__generate__serving__tp": 1}, "serving_memory", "stages.generate.serving.weight_dtype", "error"),
    ({"stages__train__micro_batch": 12}, "train_memory", "stages.train.micro_batch", "error"),
    ({"hardware__gpu__fp8_tflops": None, "stages__generate__serving__weight_dtype": "fp8"}, "fp8_unsupported",
     "stages.generate.serving.weight_dtype", "error"),
    ({"stages__generate__serving__weight_dtype": "fp8"}, "fp8_online_quantization",
     "stages.generate.serving.checkpoint", "warning"),
    ({"stages__generate__serving__max_running_requests": 8}, "serving_batch_capped",
     "stages.generate.serving.max_running_requests", "warning"),
    ({"stages__generate__concurrency": 4}, "serving_batch_capped", "stages.generate.concurrency", "warning"),
    ({"hardware__host_memory_gb": 512}, "hicache_host_memory", "stages.generate.hierarchical_cache", "error"),
    ({"drafter__target_layer_ids": [1, 16, 31, 46, 64]}, "target_layers_range", "drafter.target_layer_ids", "error"),
    ({"drafter__target_layer_ids": [1, 16, 16, 46, 61]}, "target_layers_order", "drafter.target_layer_ids", "error"),
    ({"drafter__target_layer_ids": [1, 16, 31]}, "target_layers_count", "drafter.target_layer_ids", "error"),
    ({"drafter__num_target_layers": 65}, "target_layers_order", "drafter.num_target_layers", "error"),
    ({"drafter__layer_types": ["sliding_attention"] * 5}, "sliding_window_missing", "drafter.sliding_window", "error"),
    ({"drafter__layer_types": ["sliding_attention"] * 5, "drafter__sliding_window": 8},
     "sliding_window_small", "drafter.sliding_window", "error"),
    ({"drafter__sliding_window": 2048}, "sliding_window_unused", "drafter.sliding_window", "warning"),
    ({"drafter__layer_types": ["full_attention"] * 3}, "layer_types_length", "drafter.layer_types", "error"),
    ({"drafter__mask_token_id": 300_000}, "mask_token_range", "drafter.mask_token_id", "error"),
    ({"stages__train__mode": "offline"}, "offline_over_budget", "stages.train.mode", "error"),
    ({"budget__max_usd": 100}, "budget_usd", "budget.max_usd", "error"),
    ({"budget__max_days": 1}, "budget_days", "budget.max_days", "error"),
    ({"budget__max_storage_bytes": "50GB"}, "budget_storage", "budget.max_storage_bytes", "error"),
    ({"target__chat_template__enable_thinking": False}, "thinking_off",
     "target.chat_template.enable_thinking", "error"),
    ({"stages__generate__max_tokens": 1024}, "generate_truncation", "stages.generate.max_tokens", "error"),
    ({"acknowledge": [], "stages__tokenize__max_length": 512}, "train_truncation", "stages.tokenize.max_length",
     "error"),
    ({"acknowledge": ["thinking_of"]}, "acknowledge_unknown", "acknowledge", "error"),
    ({"stages__generate__backend": "transformers"}, "transformers_big_target", "stages.generate.backend", "warning"),
    ({"stages__generate__context_length": 300_000}, "context_too_long", "stages.generate.context_length", "error"),
    ({"stages__train__global_batch": 60}, "global_batch", "stages.train.global_batch", "error"),
    ({"stages__train__master_weights": "bf16", "stages__train__zero_stage": 0}, "master_weights_zero",
     "stages.train.master_weights", "error"),
    ({"stages__train__loss": "dpace", "stages__train__loss_kernel": "liger"}, "loss_kernel_objective",
     "stages.train.loss_kernel", "error"),
    ({"stages__train__labels": "target", "stages__train__mode": "offline", "budget__max_storage_bytes": "100TiB",
      "budget__max_days": None}, "labels_offline", "stages.train.labels", "error"),
    ({"stages__train__max_steps": 5}, "train_too_short", "stages.train.epochs", "warning"),
    ({"stages__train__shard_target": "always", "target__precision": "fp8"}, "shard_fp8_target",
     "stages.train.shard_target", "error"),
])
def test_rule_fails_with_key_and_fix(overrides, code, key, severity):
    found = codes(b200(**overrides))
    assert code in found, found
    assert found[code]["key"] == key and found[code]["severity"] == severity
    assert found[code]["fix"] and found[code]["message"]


@pytest.mark.parametrize("overrides", [
    {"stages__generate__serving__dp": 4, "stages__generate__serving__tp": 2,  # tp x dp = 8
     "stages__generate__hierarchical_cache": False},  # 4 TP-2 pools x 2 would outgrow the 2 TB host
    {"stages__generate__serving__max_running_requests": 512},  # the state pool binds, not the cap
    {"hardware__host_memory_gb": 512, "stages__generate__hierarchical_cache": False},
    {"stages__generate__serving": {"weight_dtype": "fp8", "checkpoint": "Qwen/Qwen3.6-27B-FP8"},
     "stages__generate__hierarchical_cache": False},
    {"drafter__target_layer_ids": [0, 10, 20, 40, 63]},
    {"drafter__block_size": 2},
    {"drafter__layer_types": ["sliding_attention"] * 4 + ["full_attention"], "drafter__sliding_window": 2048},
    {"drafter__mask_token_id": None},  # filled from the target facts
    {"stages__train__mode": "offline", "stages__train__labels": "data", "budget__max_storage_bytes": "100TiB",
     "budget__max_days": None},
    {"stages__generate__backend": "transformers", "target__model": "Qwen/Qwen3-8B",
     "drafter__mask_token_id": None, "budget__max_days": None, "budget__max_usd": None},
    {"stages__train__global_batch": 48},
    {"drafter__precision": "fp8", "stages__train__master_weights": "bf16", "stages__train__compile": True},
    {"stages__train__loss": "dpace", "stages__train__optimizer": "muon", "stages__train__labels": "target"},
    {"stages__train__max_steps": 100},
    {"stages__train__shard_target": "always"},
])
def test_rule_passes(overrides):
    assert [f for f in codes(b200(**overrides)).values() if f["severity"] == "error"] == []


def test_days_over_budget_on_the_seeds_node():
    """About 31 days on 4x RTX PRO 6000 exceed a 20-day budget; the fix names the faster node."""
    found = codes(seeds_recipe(budget__max_days=20))
    assert "hardware=b200_nvl8" in found["budget_days"]["fix"]


def test_fp8_drafter_needs_an_fp8_gpu():
    found = codes(b200(hardware__gpu__fp8_tflops=None, stages__generate__serving__weight_dtype="bf16",
                       stages__generate__serving__kv_cache_dtype="auto", drafter__precision="fp8"))["fp8_unsupported"]
    assert found["key"] == "drafter.precision" and "drafter.precision to bf16" in found["fix"]
    assert codes(tiny_recipe(drafter__precision="fp8"))["fp8_unsupported"]["key"] == "drafter.precision"  # CPU


def test_fp8_kv_cache_needs_fp8_too():
    found = codes(b200(hardware__gpu__fp8_tflops=None, stages__generate__serving__kv_cache_dtype="fp8_e4m3"))
    assert found["fp8_unsupported"]["key"] == "stages.generate.serving.kv_cache_dtype"


def test_mask_token_unknown_without_facts_or_recipe_value():
    facts = lookup("Qwen/Qwen3.6-27B").model_copy(update={"mask_token_id": None})
    assert codes(b200(drafter__mask_token_id=None), facts)["mask_token_unknown"]["key"] == "drafter.mask_token_id"


def test_sglang_needs_a_gpu_unless_urls_are_given():
    assert codes(tiny_recipe(stages__generate__backend="sglang"))["sglang_needs_gpu"]["severity"] == "error"
    attached = tiny_recipe(stages__generate__backend="sglang", stages__generate__urls=["http://127.0.0.1:1"])
    assert "sglang_needs_gpu" not in codes(attached)


def test_tiny_context_is_checked_against_the_tiny_target():
    found = codes(tiny_recipe(stages__generate__max_tokens=4096))
    assert found["context_too_long"]["key"] == "stages.generate.max_tokens"


def test_unknown_dataset_size_warns():
    assert "dataset_size_unknown" in codes(tiny_recipe(dataset__stats__samples=None))


def test_unknown_target_is_an_error_and_arch_resolves_it():
    assert "unknown_target" in codes(b200(target__model="someone/private-27b"))
    assert set(codes(b200(target__model="/models/my-ft", target__arch="qwen3.6-27b"))) == {"train_truncation"}


def test_make_plan_does_no_io(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the planner must not do I/O")

    recipe = b200()
    monkeypatch.setattr(builtins, "open", refuse)
    monkeypatch.setattr(socket, "socket", refuse)
    assert make_plan(recipe).to_json(explain=True)["stages"]


def test_planning_imports_no_torch():
    code = (
        "import sys; sys.path.insert(0, 'tests')\n"
        "from _plan_recipes import seeds_recipe\n"
        "from dflashx.plan.plan import make_plan\n"
        "make_plan(seeds_recipe()).to_json(explain=True)\n"
        "heavy = [m for m in ('torch', 'transformers', 'deepspeed') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_a_block_without_a_token_to_draft_is_a_schema_error():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="block_size"):
        b200(drafter__block_size=1)


@pytest.mark.parametrize(("overrides", "code", "share"), [
    ({"stages__generate__max_tokens": 1024}, "generate_truncation", "61%"),
    ({"acknowledge": [], "stages__tokenize__max_length": 512}, "train_truncation", "97%"),
])
def test_truncation_blocks_with_the_expected_share(overrides, code, share):
    """The seeds' mean output (1,818 tokens) under a log-normal spread: the share in the message."""
    found = codes(seeds_recipe(**overrides))[code]
    assert found["severity"] == "error" and f"about {share}" in found["message"]
    assert f"acknowledge: [{code}]" in found["fix"]


def test_a_stated_p90_replaces_the_assumed_spread():
    narrow = codes(seeds_recipe(dataset__stats__output_tokens_p90=2200, acknowledge=[]))
    assert "train_truncation" not in narrow  # p90 2,200 < 3,072 - 255: few samples are cut
    wide = codes(seeds_recipe(dataset__stats__output_tokens_p90=6000, acknowledge=[]))
    assert "output_tokens_p90" in wide["train_truncation"]["message"]


def test_acknowledged_thinking_off_is_a_warning():
    found = codes(b200(target__chat_template__enable_thinking=False, acknowledge=["thinking_off", "train_truncation"]))
    assert found["thinking_off"]["severity"] == "warning" and "acknowledged" in found["thinking_off"]["message"]


def test_a_run_too_short_to_learn_names_what_the_tiny_run_needed():
    """speculators' defaults make 60 optimizer steps on a data set of the tiny's size: far below what
    the tiny run needed; the tiny recipe itself is not flagged."""
    short = codes(tiny_recipe(stages__train__epochs=0.1, stages__train__global_batch=16))
    assert "train_too_short" in short and "optimizer steps" in short["train_too_short"]["message"]
    assert "train_too_short" not in codes(tiny_recipe())
    sixty = codes(tiny_recipe(stages__train__max_steps=60))
    assert "train_too_short" in sixty and "60 optimizer steps" in sixty["train_too_short"]["message"]
