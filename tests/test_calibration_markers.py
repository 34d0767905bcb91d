"""Calibration's condition groups come from `calibrates` markers on the schema fields (issue 22)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from dflashx.config.fields import BY_FIELD, CALIBRATES, CALIBRATION_GROUPS
from dflashx.config.load import load_recipe
from dflashx.config.schema import Recipe
from dflashx.plan.calibration import calibration_marker, conditions

_TARGET = {"target.model", "target.tokenizer", "target.precision", "target.chat_template.enable_thinking",
           "target.chat_template.kwargs"}
_SAMPLING = {f"stages.generate.{k}" for k in ("backend", "max_tokens", "temperature", "top_p", "context_length")}
_HARDWARE = {f"hardware.{k}" for k in ("name", "gpus_per_node", "nodes", "interconnect", "interconnect_gbs",
                                       "internode_gbs", "host_memory_gb", "cpu_tflops", "cpu_bandwidth_tbs")}
_GPU = {"hardware.gpu." + k for k in ("name", "memory_gb", "bandwidth_tbs", "bf16_tflops", "fp8_tflops")}
_SERVING = {"stages.generate." + k for k in (
    "batch_size", "concurrency", "hierarchical_cache", "serving.checkpoint", "serving.dp", "serving.dp_mode",
    "serving.kv_cache_dtype", "serving.max_running_requests", "serving.mem_fraction_static", "serving.tp",
    "serving.weight_dtype", "serving.drafter", "serving.speculative.acceptance", "serving.speculative.algorithm",
    "serving.speculative.eagle_topk", "serving.speculative.num_draft_tokens", "serving.speculative.num_steps")}
_DRAFTER = {"drafter." + k for k in ("architecture", "conv_kernel_size", "conv_group_size", "selector_rank",
                                     "selector_top_k", "block_size", "init_from", "intermediate_size", "layer_types",
                                     "mask_token_id", "num_layers", "num_target_layers", "precision", "sliding_window",
                                     "target_layer_ids")}
_TRAIN = {"stages.train." + k for k in ("anchors_per_seq", "global_batch", "max_length", "micro_batch", "mode",
                                        "zero_stage")} | {"stages.tokenize.max_length"}

# What else decides a held-out τ curve: how the drafter learns (the optimisation and objective) and what is decoded.
_LEARNING = {"stages.train." + k for k in (
    "lr", "weight_decay", "warmup_ratio", "grad_clip", "loss_gamma", "loss", "dpace_alpha", "labels", "optimizer",
    "muon_lr", "muon_momentum", "schedule", "selector_weight", "selector_warmup_ratio", "selector_gold_missing",
    "master_weights")}
_TAU_SLICE = {"stages.train.tau_prompts", "stages.train.tau_max_new_tokens"}


@pytest.mark.parametrize(("path", "gpu"), [("recipes/tiny.yaml", {"hardware.gpu"}),
                                           ("recipes/qwen36_27b.yaml", _GPU)])
def test_each_group_holds_the_keys_its_figures_were_measured_under(path: str, gpu: set[str]) -> None:
    groups = conditions(load_recipe(path).recipe)
    assert set(groups) == {"data", "serving", "training", "tau"}
    assert set(groups["data"]) == {"dataset.sources", "dataset.dedupe", "dataset.eval_holdout"} | _TARGET | _SAMPLING
    assert set(groups["serving"]) == _HARDWARE | gpu | _TARGET | _SAMPLING | _SERVING
    assert set(groups["training"]) == _HARDWARE | gpu | _TARGET | _DRAFTER | _TRAIN
    assert set(groups["tau"]) == set(groups["data"]) | set(groups["training"]) | _LEARNING | _TAU_SLICE


def test_a_source_enters_the_data_group_without_its_expected_count() -> None:
    recipe = load_recipe("recipes/tiny.yaml").recipe
    sources = conditions(recipe)["data"]["dataset.sources"]
    assert isinstance(sources, list) and len(sources) == len(recipe.dataset.sources)
    assert all("expected_count" not in s and "name" in s for s in sources)


def _models(annotation) -> list[type[BaseModel]]:
    from typing import get_args

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models(arg)]


def _unmarked(model: type[BaseModel], where: str) -> list[str]:
    """Fields the calibration walk reaches with no `calibrates` marker (or an unknown group)."""
    missing = []
    for name, info in model.model_fields.items():
        marker, dotted = calibration_marker(info), f"{where}.{name}"
        if marker == BY_FIELD[CALIBRATES]:
            subs = _models(info.annotation)
            assert subs, f"{dotted} walks its fields but holds no model"
            for sub in subs:
                missing += _unmarked(sub, dotted)
        elif not isinstance(marker, list) or not set(marker) <= set(CALIBRATION_GROUPS):
            missing.append(dotted)
    return missing


def test_every_field_the_calibration_walk_reaches_says_which_groups_it_conditions():
    """A new field of a walked model must say calibrates(...), BY_FIELD or UNCALIBRATED: none is left out silently."""
    assert _unmarked(Recipe, "recipe") == []
