"""The DFlash2 export contract (`export.dflash2`, through `check_sglang`): one test per rule of the loaders
that serve DFlash2 (vLLM 0.32.0's `qwen3_dflash2.py` on its DFlash loader, SGLang 0.5.23's `models/dflash.py`
and `parse_dflash_draft_config`, the z-lab reference `dflash` 0.1.0), each breaking exactly that rule in a
good export and asserting the checker names its key and its fix. docs/export.md's DFlash2 table lists every
rule with its engine sources and the id of its test here.

The good exports are what the exporter writes (`DFlashConfig.from_target(...).to_hf_dict()`) for the
Qwen3.6-27B seed's target with `drafter.architecture: dflash2`, two sliding-window layers (as the published
checkpoints) or two full-attention layers, and the weight shapes a drafter of that config has."""

from __future__ import annotations

import copy
import json
from typing import Any, Callable

import pytest
from test_export_contracts import _exported, _resolved, _shapes

from dflashx.export import Serving, check_sglang, readme
from dflashx.export.serve import sglang_argv, vllm_argv, vllm_env

SLIDING = {"architecture": "dflash2", "num_layers": 2, "block_size": 8, "sliding_window": 2048,
           "layer_types": ["sliding_attention", "sliding_attention"]}
FULL = {"architecture": "dflash2", "num_layers": 2, "block_size": 8}
Edit = Callable[[dict[str, Any]], None]


@pytest.fixture(scope="module")
def seeds():
    return {"sliding": _resolved("qwen36_27b.yaml", **SLIDING), "full": _resolved("qwen36_27b.yaml", **FULL)}


def keys(violations) -> list[str]:
    return [v.key for v in violations]


def put(value: Any, *path: str) -> Edit:
    def edit(config: dict[str, Any]) -> None:
        for part in path[:-1]:
            config = config[part]
        config[path[-1]] = value
    return edit


def drop(*path: str) -> Edit:
    def edit(config: dict[str, Any]) -> None:
        for part in path[:-1]:
            config = config[part]
        config.pop(path[-1])
    return edit


def both(*edits: Edit) -> Edit:
    def edit(config: dict[str, Any]) -> None:
        for one in edits:
            one(config)
    return edit


def to_top(key: str) -> Edit:
    """A DFlash2 key moved from dflash_config to the top level (where only the reference looks)."""
    def edit(config: dict[str, Any]) -> None:
        config[key] = config["dflash_config"].pop(key)
    return edit


@pytest.mark.parametrize("base", ["sliding", "full"])
def test_the_exported_dflash2_drafter_meets_the_contract(seeds, base):
    resolved = seeds[base]
    config = _exported(resolved)
    assert config["architectures"] == ["DFlash2DraftModel"] and config["is_causal"] is False
    assert check_sglang(config, resolved.target.facts, _shapes(config)) == []
    shapes = _shapes(config)
    assert shapes["candidate_selector.predecessor_codebook"] == (248_320, 256)
    assert shapes["layers.1.mlp_conv.kernel_projection.weight"] == (2 * 2 * 5120 // 16, 5120)


# (test id, base export, the break, the key the checker must name, a phrase its fix must hold)
RULES: list[tuple[str, str, Edit, str, str]] = [
    # the architecture both engines dispatch on, and Qwen3 layers
    ("architecture-dflash-with-dflash2-keys", "full", put(["DFlashDraftModel"], "architectures"), "architectures",
     "DFlash2DraftModel"),
    ("model-type", "sliding", put("llama", "model_type"), "model_type", "model_type: qwen3"),
    # the four DFlash2 keys (vLLM int(dflash_config[key]); SGLang builds no convolution without conv_kernel_size)
    ("conv-kernel-missing", "sliding", drop("dflash_config", "conv_kernel_size"), "dflash_config.conv_kernel_size",
     "drafter.conv_kernel_size"),
    ("conv-kernel-a-string", "sliding", put("2", "dflash_config", "conv_kernel_size"),
     "dflash_config.conv_kernel_size", "drafter.conv_kernel_size"),
    ("conv-group-missing", "sliding", drop("dflash_config", "conv_group_size"), "dflash_config.conv_group_size",
     "drafter.conv_group_size"),
    ("conv-group-not-dividing", "sliding", put(48, "dflash_config", "conv_group_size"),
     "dflash_config.conv_group_size", "drafter.conv_group_size"),
    ("selector-rank-missing", "sliding", drop("dflash_config", "selector_rank"), "dflash_config.selector_rank",
     "drafter.selector_rank"),
    ("selector-top-k-missing", "sliding", drop("dflash_config", "selector_top_k"), "dflash_config.selector_top_k",
     "drafter.selector_top_k"),
    ("selector-top-k-beyond-vocab", "sliding", put(300_000, "dflash_config", "selector_top_k"),
     "dflash_config.selector_top_k", "drafter.selector_top_k"),
    ("dflash2-key-at-top-level-only", "sliding", to_top("selector_top_k"), "dflash_config.selector_top_k",
     "into dflash_config"),
    # the block: present, one value (vLLM sizes its convolution from num_speculative_tokens + 1: the commands)
    ("block-size-missing", "sliding", both(drop("block_size"), drop("dflash_config", "block_size")), "block_size",
     "drafter.block_size"),
    ("block-sizes-disagree", "sliding", put(16, "dflash_config", "block_size"), "block_size", "one value"),
    # causality: every layer bidirectional in every loader
    ("is-causal-missing-sliding", "sliding", drop("is_causal"), "is_causal", '"is_causal": false'),
    ("is-causal-true", "full", put(True, "is_causal"), "is_causal", '"is_causal": false'),
    ("is-causal-a-string", "full", put("false", "is_causal"), "is_causal", '"is_causal": false'),
    ("vllm-dflash-config-causal", "full", both(drop("is_causal"), put(True, "dflash_config", "causal")),
     "dflash_config.causal", "drop dflash_config.causal"),
    ("causal-layers-recorded", "sliding", put([True, True], "dflash_config", "causal_layers"),
     "dflash_config.causal_layers", "drafter.architecture: dflash2"),
    # the layer stack and its windows
    ("layer-types-missing", "sliding", drop("layer_types"), "layer_types", "drafter.layer_types"),
    ("sliding-window-missing", "sliding", drop("sliding_window"), "sliding_window", "drafter.sliding_window"),
    ("sliding-window-switched-off", "sliding", put(False, "use_sliding_window"), "use_sliding_window",
     "use_sliding_window: true"),
    ("vllm-swa-window-size", "sliding", put(1024, "dflash_config", "swa_window_size"),
     "dflash_config.swa_window_size", "drop dflash_config.swa_window_size"),
    ("hidden-size", "sliding", put(4096, "hidden_size"), "hidden_size", "train the drafter against this target"),
    ("not-swiglu", "sliding", put("gelu", "hidden_act"), "hidden_act", "hidden_act: silu"),
    # the mask token and the target's layers
    ("mask-id-missing", "sliding", drop("dflash_config", "mask_token_id"), "dflash_config.mask_token_id",
     "drafter.mask_token_id"),
    ("mask-id-beyond-vocab", "sliding", put(248_320, "dflash_config", "mask_token_id"),
     "dflash_config.mask_token_id", "drafter.mask_token_id"),
    ("layer-id-beyond-target", "sliding", put([1, 64], "dflash_config", "target_layer_ids"),
     "dflash_config.target_layer_ids", "drafter.target_layer_ids"),
    ("trained-for-another-target", "sliding", put(48, "num_target_layers"), "num_target_layers",
     "64 decoder layers"),
    ("vllm-eagle-aux-layer-ids", "sliding", put([1, 2, 3, 4, 5], "eagle_aux_hidden_state_layer_ids"),
     "eagle_aux_hidden_state_layer_ids", "drop eagle_aux_hidden_state_layer_ids"),
    # sizes the engines read from the config rather than the target
    ("codebook-vocab-size", "sliding", put(151_936, "vocab_size"), "vocab_size", "the target's vocabulary"),
    ("vllm-draft-vocab-size", "sliding", put(32_000, "draft_vocab_size"), "draft_vocab_size",
     "drop draft_vocab_size"),
    ("vllm-target-hidden-size", "sliding", put(4096, "target_hidden_size"), "target_hidden_size",
     "drop target_hidden_size"),
    # keys that change the served drafter while dflashx trains without them
    ("output-multiplier", "sliding", put(1.25, "dflash_config", "output_multiplier"),
     "dflash_config.output_multiplier", "drop dflash_config.output_multiplier"),
    ("final-logit-softcapping", "sliding", put(30.0, "dflash_config", "final_logit_softcapping"),
     "dflash_config.final_logit_softcapping", "drop dflash_config.final_logit_softcapping"),
    ("input-embedding-scale", "sliding", put(2.0, "dflash_config", "input_embedding_scale"),
     "dflash_config.input_embedding_scale", "drop dflash_config.input_embedding_scale"),
    ("reference-output-multiplier-top-level", "sliding", put(1.25, "output_multiplier"), "output_multiplier",
     "drop output_multiplier"),
    ("reference-softcapping-top-level", "sliding", put(30.0, "final_logit_softcapping"), "final_logit_softcapping",
     "drop final_logit_softcapping"),
    ("reference-embedding-scale-top-level", "sliding", put(2.0, "input_embedding_scale"), "input_embedding_scale",
     "drop input_embedding_scale"),
    ("attention-sink-bias", "sliding", put(True, "dflash_config", "attention_sink_bias"),
     "dflash_config.attention_sink_bias", "drop dflash_config.attention_sink_bias"),
    ("vllm-swa-attention-sink-bias", "sliding", put(True, "add_swa_attention_sink_bias"),
     "add_swa_attention_sink_bias", "drop add_swa_attention_sink_bias"),
    ("attention-value-scale", "sliding", put(0.5, "dflash_config", "attention_value_scale"),
     "dflash_config.attention_value_scale", "drop dflash_config.attention_value_scale"),
    ("vllm-rope-layout", "sliding", put(False, "is_neox_style"), "is_neox_style", "drop is_neox_style"),
    ("sglang-rope-layout", "sliding", put(False, "rope_is_neox_style"), "rope_is_neox_style",
     "drop rope_is_neox_style"),
    ("vllm-use-swa", "full", put(True, "dflash_config", "use_swa"), "dflash_config.use_swa",
     "drop dflash_config.use_swa"),
    ("vllm-sample-from-anchor", "sliding", put(True, "dflash_config", "sample_from_anchor"),
     "dflash_config.sample_from_anchor", "drop dflash_config.sample_from_anchor"),
    ("vllm-no-aux-hidden-state", "sliding", put(False, "dflash_config", "use_aux_hidden_state"),
     "dflash_config.use_aux_hidden_state", "drop dflash_config.use_aux_hidden_state"),
    ("vllm-no-aux-hidden-state-top-level", "sliding", put(False, "use_aux_hidden_state"), "use_aux_hidden_state",
     "drop use_aux_hidden_state"),
    ("sglang-gemma-norm", "sliding", put(True, "use_gemma_norm"), "use_gemma_norm", "drop use_gemma_norm"),
    ("sglang-domino-projector", "sliding", put("domino", "dflash_config", "projector_type"),
     "dflash_config.projector_type", "drop dflash_config.projector_type"),
]


@pytest.mark.parametrize(("what", "base", "edit", "key", "fix"), RULES, ids=[r[0] for r in RULES])
def test_each_dflash2_rule_names_its_key_and_fix(seeds, what, base, edit, key, fix):
    resolved = seeds[base]
    config = copy.deepcopy(_exported(resolved))
    edit(config)
    found = check_sglang(config, resolved.target.facts)
    assert keys(found) == [key], found
    assert fix in found[0].fix and found[0].message, found[0]


def test_full_attention_layers_need_no_is_causal_and_neutral_values_pass(seeds):
    """The loaders serve full_attention layers bidirectional without is_causal; the keys dflashx trains without
    may be present at the value it trains with."""
    resolved = seeds["full"]
    config = _exported(resolved)
    del config["is_causal"]
    config["dflash_config"] |= {"output_multiplier": 1.0, "final_logit_softcapping": 0, "causal": False,
                                "use_swa": False, "sample_from_anchor": False, "attention_sink_bias": False}
    config |= {"is_neox_style": True, "use_aux_hidden_state": True, "draft_vocab_size": 248_320,
               "target_hidden_size": 5120, "eagle_aux_hidden_state_layer_ids": [
                   i + 1 for i in config["dflash_config"]["target_layer_ids"]]}
    assert check_sglang(config, resolved.target.facts, _shapes(config)) == []


WEIGHTS: list[tuple[str, Callable[[dict[str, tuple[int, ...]]], dict[str, tuple[int, ...]]], str, str]] = [
    ("codebook-named-weight", lambda s: {(k + ".weight" if "codebook" in k else k): v for k, v in s.items()},
     "model.safetensors", "not in the layout"),
    ("conv-tensor-missing", lambda s: {k: v for k, v in s.items() if k != "layers.1.attention_conv.base_kernel"},
     "model.safetensors", "are missing"),
    ("selector-missing", lambda s: {k: v for k, v in s.items() if not k.startswith("candidate_selector.")},
     "model.safetensors", "are missing"),
    ("conv-kernel-shape", lambda s: s | {"layers.0.attention_conv.base_kernel": (2, 3, 5120)},
     "model.safetensors", "base_kernel is [2, 3, 5120]"),
    ("codebook-rank", lambda s: s | {"candidate_selector.successor_codebook": (248_320, 128)},
     "model.safetensors", "successor_codebook is [248320, 128]"),
    ("mask-hidden-tensor", lambda s: s | {"mask_hidden": (5120,)}, "model.safetensors", "mask_hidden"),
    ("fc-width", lambda s: s | {"fc.weight": (5120, 3 * 5120)}, "dflash_config.target_layer_ids", "names 5 layers"),
]


@pytest.mark.parametrize(("what", "edit", "key", "message"), WEIGHTS, ids=[w[0] for w in WEIGHTS])
def test_each_dflash2_weight_rule_names_its_key_and_fix(seeds, what, edit, key, message):
    resolved = seeds["sliding"]
    config = _exported(resolved)
    found = check_sglang(config, resolved.target.facts, edit(_shapes(config)))
    assert keys(found) == [key], found
    assert message in found[0].message and found[0].fix, found[0]


def test_dflash2_serve_commands(seeds):
    resolved = seeds["sliding"]
    config = _exported(resolved)
    s = Serving.of(config, resolved.target.facts, "Qwen/Qwen3.6-27B", "/r/export/drafter", "/r/export/drafter-vllm")
    assert s.architecture == "dflash2"
    argv = sglang_argv(s)
    assert argv[argv.index("--speculative-algorithm") + 1] == "DFLASH"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "8"
    vllm = vllm_argv(s)
    spec = json.loads(vllm[vllm.index("--speculative-config") + 1])
    # vLLM takes the convolution's block from num_speculative_tokens + 1 and reads dflash_config itself
    assert spec == {"method": "dflash", "model": "/r/export/drafter", "num_speculative_tokens": 7}
    assert vllm_env(s) == {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    assert "VLLM_USE_V2_MODEL_RUNNER=1 vllm serve Qwen/Qwen3.6-27B" in readme(s, config, "qwen36", "bf16")
    plain = Serving.of(_exported(_resolved("qwen36_27b.yaml", architecture="dflash")), resolved.target.facts,
                       "Qwen/Qwen3.6-27B", "/r/d", "/r/v")
    assert plain.architecture == "dflash" and vllm_env(plain) == {}
    assert json.loads(vllm_argv(plain)[vllm_argv(plain).index("--speculative-config") + 1])["model"] == "/r/v"
