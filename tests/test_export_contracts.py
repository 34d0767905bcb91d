"""Engine contracts at export: the SGLang / z-lab and speculators / vLLM checkers, the layout
conversion and the serve commands.

The good configs are the ones the shipped recipes' drafters export (`DFlashConfig.from_target` on
the resolved recipe, as the trainer builds it, then `to_hf_dict`), checked against the recipe's
own target facts. Each contract rule is then broken in turn, and the checker must name exactly
that key."""

from __future__ import annotations

import copy
import shlex
from pathlib import Path
from typing import Any, Callable

import pytest

from dflashx.config.load import load_recipe
from dflashx.config.schema import Recipe
from dflashx.dflash.config import DFlashConfig
from dflashx.export import (
    Serving,
    Violation,
    check_sglang,
    check_speculators,
    commands,
    from_speculators,
    readme,
    to_speculators,
)
from dflashx.export.serve import shell, sglang_argv, vllm_argv
from dflashx.export.causality import vllm_reads, vllm_reads_speculators
from dflashx.export.speculators import fits
from dflashx.resolve import ResolvedRecipe, resolve
from dflashx.targets.facts import facts_for

REPO = Path(__file__).resolve().parents[1]
SLIDING = {"num_layers": 2, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 64}
ALL_SLIDING = SLIDING | {"layer_types": ["sliding_attention", "sliding_attention"]}  # all causal: a speculators form


def _resolved(recipe: str, **drafter: Any) -> ResolvedRecipe:
    data = copy.deepcopy(load_recipe(REPO / "recipes" / recipe).data)
    data["drafter"] = {**data["drafter"], **drafter}
    parsed = Recipe.model_validate(data)
    return resolve(parsed, facts_for(parsed.target))


def _exported(resolved: ResolvedRecipe) -> dict[str, Any]:
    """The config.json the export writes for this recipe's drafter."""
    f = resolved.target.facts
    target = {"hidden_size": f.hidden_size, "num_attention_heads": f.num_attention_heads,
              "num_hidden_layers": f.num_layers, "num_key_value_heads": f.num_kv_heads, "head_dim": f.head_dim,
              "vocab_size": f.vocab_size, "max_position_embeddings": f.max_position_embeddings}
    return DFlashConfig.from_target(resolved.drafter, target).to_hf_dict()


def _shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The weight shapes a drafter of this config has."""
    c = DFlashConfig.from_hf_dict(config)
    h, q, kv = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    shapes = {"fc.weight": (h, c.k * h), "hidden_norm.weight": (h,), "norm.weight": (h,)}
    for i in range(c.num_layers):
        p = f"layers.{i}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                   p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                   p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                   p + "self_attn.q_norm.weight": (c.head_dim,), p + "self_attn.k_norm.weight": (c.head_dim,),
                   p + "mlp.gate_proj.weight": (c.intermediate_size, h),
                   p + "mlp.up_proj.weight": (c.intermediate_size, h),
                   p + "mlp.down_proj.weight": (h, c.intermediate_size)}
        if c.architecture == "dflash2":
            dynamic = 2 * c.conv_kernel_size * h // c.conv_group_size
            shapes |= {p + f"{conv}_conv.{name}": shape for conv in ("attention", "mlp") for name, shape in
                       (("base_kernel", (2, c.conv_kernel_size, h)), ("kernel_projection.weight", (dynamic, h)))}
    if c.architecture == "dflash2":  # the codebooks are stored without `.weight` (the published layout)
        shapes |= {"candidate_selector.predecessor_codebook": (c.vocab_size, c.selector_rank),
                   "candidate_selector.successor_codebook": (c.vocab_size, c.selector_rank),
                   "candidate_selector.hidden_projection.weight": (c.selector_rank, h)}
    return shapes


@pytest.fixture(scope="module")
def tiny() -> ResolvedRecipe:
    return _resolved("tiny.yaml")


@pytest.fixture(scope="module")
def sliding() -> ResolvedRecipe:
    return _resolved("tiny.yaml", **SLIDING)


@pytest.fixture(scope="module")
def all_sliding() -> ResolvedRecipe:
    return _resolved("tiny.yaml", **ALL_SLIDING)


def _keys(violations: list[Violation]) -> list[str]:
    return [v.key for v in violations]


# --------------------------------------------------------------------------- the good exports


@pytest.mark.parametrize("recipe,drafter", [("tiny.yaml", {}), ("tiny.yaml", SLIDING), ("tiny.yaml", ALL_SLIDING),
                                            ("qwen36_27b.yaml", {}),
                                            ("qwen36_27b.yaml", {"architecture": "dflash"})])
def test_the_shipped_recipes_drafters_pass_both_checkers(recipe, drafter):
    resolved = _resolved(recipe, **drafter)
    facts, config = resolved.target.facts, _exported(resolved)
    assert check_sglang(config, facts, _shapes(config)) == []
    if resolved.drafter.architecture == "dflash2":  # vLLM serves DFlash2 from this layout: no speculators form
        assert config["architectures"] == ["DFlash2DraftModel"] and not fits(config)
        return
    spec = to_speculators(config, verifier=resolved.target.model)
    if "sliding_attention" in config["layer_types"] and "full_attention" in config["layer_types"]:
        # a sliding layer causal and a full one bidirectional: vLLM reads one causality for every layer from a
        # speculators config, so this drafter has none (vLLM serves the DFlash folder)
        assert not fits(config)
        assert _keys(check_speculators(spec, facts, _shapes(config))) == ["sliding_window_non_causal"]
        return
    assert fits(config)
    assert check_speculators(spec, facts, _shapes(config)) == []
    assert spec["aux_hidden_state_layer_ids"] == [i + 1 for i in resolved.drafter.target_layer_ids]
    assert spec["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == resolved.drafter.block_size - 1


@pytest.mark.parametrize("causal", [[False, False], [True, True]])
def test_speculators_round_trip_keeps_the_drafter(sliding, causal):
    """A drafter whose layers are alike converts to a speculators config that vLLM reads back with the trained
    causality (vLLM 0.32 `update_dflash`: `dflash_config.causal = not sliding_window_non_causal`, every layer)."""
    config = copy.deepcopy(_exported(sliding))
    config["dflash_config"]["causal_layers"], config["is_causal"] = causal, causal[0]
    spec = to_speculators(config, "builtin:tiny-qwen3")
    assert spec["sliding_window_non_causal"] is (not causal[0])
    assert vllm_reads_speculators(spec) == causal
    back = from_speculators(spec, sliding.target.facts.num_layers)
    assert DFlashConfig.from_hf_dict(back) == DFlashConfig.from_hf_dict(config).model_copy(update={"mask_token": None})


def test_a_drafter_whose_layers_differ_has_no_speculators_form(sliding):
    config = _exported(sliding)  # the sliding layer causal, the full one bidirectional (the served rule)
    assert config["dflash_config"]["causal_layers"] == [True, False] and not fits(config)
    assert vllm_reads(config, config["dflash_config"]) == [True, False]  # the DFlash folder is read as trained


def test_f5ac536s_speculators_export_is_named(tiny):
    """f5ac536 wrote `sliding_window_non_causal: false` for the all-bidirectional tiny drafter: vLLM then made every
    layer causal and accepted 8.8% less (3.967 against 4.349, issue 37). The checker names it, with the fix."""
    config = _exported(tiny)
    spec = to_speculators(config, "t") | {"sliding_window_non_causal": False}
    trained = config["dflash_config"]["causal_layers"]
    broken = check_speculators(spec, tiny.target.facts, _shapes(config), causal=trained)
    assert _keys(broken) == ["sliding_window_non_causal"] and "write sliding_window_non_causal: true" in broken[0].fix
    assert _keys(check_speculators(spec, tiny.target.facts, _shapes(config))) == ["sliding_window_non_causal"]
    assert to_speculators(config, "t")["sliding_window_non_causal"] is True


def test_vllm_reading_of_the_dflash_folder_is_held_to_training(tiny):
    """vLLM reads `is_causal`, else `dflash_config.causal`, for every layer of the DFlash folder too."""
    config = copy.deepcopy(_exported(tiny))
    assert config["is_causal"] is False and vllm_reads(config, config["dflash_config"]) == [False]
    config["dflash_config"]["causal"] = True  # is_causal still decides: no change
    assert check_sglang(config, tiny.target.facts, _shapes(config)) == []
    del config["is_causal"]  # now vLLM would make the bidirectional layer causal; SGLang reads neither
    assert _keys(check_sglang(config, tiny.target.facts, _shapes(config))) == ["is_causal"]


# --------------------------------------------------------------------------- each rule broken in turn


def _parent(config: Any, path: tuple[Any, ...]) -> Any:
    for part in path[:-1]:
        config = config[part]
    return config


def _drop(*path: Any) -> Callable[[dict[str, Any]], None]:
    return lambda config: _parent(config, path).pop(path[-1])


def _set(value: Any, *path: Any) -> Callable[[dict[str, Any]], None]:
    return lambda config: _parent(config, path).__setitem__(path[-1], value)


# (what, base, mutation of the DFlash config, key SGLang's checker names, key the speculators checker
# names on the converted config: None where the converter writes the value itself)
LISTED = [
    ("wrong architecture name", "tiny", _set(["DFlashModel"], "architectures"), "architectures", None),
    ("layer id out of range", "tiny", _set([1, 6], "dflash_config", "target_layer_ids"),
     "dflash_config.target_layer_ids", "aux_hidden_state_layer_ids"),
    ("float mask id", "tiny", _set(5.0, "dflash_config", "mask_token_id"), "dflash_config.mask_token_id",
     "mask_token_id"),
    ("sliding layer without sliding_window", "all_sliding", _drop("sliding_window"), "sliding_window",
     "transformer_layer_config.sliding_window"),
    ("block size missing", "tiny", _drop("block_size"), "block_size", "block_size"),
]


@pytest.mark.parametrize("what,base,mutate,sglang_key,spec_key", LISTED, ids=[r[0] for r in LISTED])
def test_each_listed_rule_broken_is_named_by_both_checkers(what, base, mutate, sglang_key, spec_key, tiny, all_sliding):
    resolved = {"tiny": tiny, "all_sliding": all_sliding}[base]
    config = _exported(resolved)
    mutate(config)
    violations = check_sglang(config, resolved.target.facts)
    assert _keys(violations) == [sglang_key], violations
    assert violations[0].fix and violations[0].message
    converted = check_speculators(to_speculators(config, "t"), resolved.target.facts)
    assert _keys(converted) == ([spec_key] if spec_key else []), converted


SGLANG_MORE = [
    ("layer id negative", "tiny", _set([-1, 3], "dflash_config", "target_layer_ids"), "dflash_config.target_layer_ids"),
    ("layer ids not a list", "tiny", _set(3, "dflash_config", "target_layer_ids"), "dflash_config.target_layer_ids"),
    ("mask id outside the vocabulary", "tiny", _set(1024, "dflash_config", "mask_token_id"),
     "dflash_config.mask_token_id"),
    ("mask id a bool", "tiny", _set(True, "dflash_config", "mask_token_id"), "dflash_config.mask_token_id"),
    ("mask id missing", "tiny", _drop("dflash_config", "mask_token_id"), "dflash_config.mask_token_id"),
    ("empty mask token", "tiny", _set("", "dflash_config", "mask_token"), "dflash_config.mask_token"),
    ("block size a float", "tiny", _set(8.0, "block_size"), "block_size"),
    ("block sizes disagree", "tiny", _set(16, "dflash_config", "block_size"), "block_size"),
    ("trained for another target", "tiny", _set(8, "num_target_layers"), "num_target_layers"),
    ("no dflash_config", "tiny", _drop("dflash_config"), None),
    ("window switched off", "sliding", _set(False, "use_sliding_window"), "use_sliding_window"),
    ("layer_types missing", "tiny", _drop("layer_types"), "layer_types"),
    ("layer_types too short", "sliding", _set(["full_attention"], "layer_types"), "layer_types"),
    ("linear layer in the drafter", "tiny", _set(["linear_attention"], "layer_types"), "layer_types"),
    ("causal flags the engine ignores", "sliding", _set([True, True], "dflash_config", "causal_layers"),
     "dflash_config.causal_layers"),
    ("hidden size of another target", "tiny", _set(64, "hidden_size"), "hidden_size"),
    ("not SwiGLU", "tiny", _set("gelu", "hidden_act"), "hidden_act"),
    ("not Qwen3 layers", "tiny", _set("llama", "model_type"), "model_type"),
]


@pytest.mark.parametrize("what,base,mutate,key", SGLANG_MORE, ids=[r[0] for r in SGLANG_MORE])
def test_sglang_checker_names_each_broken_rule(what, base, mutate, key, tiny, sliding):
    resolved = {"tiny": tiny, "sliding": sliding}[base]
    config = _exported(resolved)
    mutate(config)
    keys = _keys(check_sglang(config, resolved.target.facts))
    if key is None:  # no dflash_config: its own key plus everything that lives in it
        assert keys[0] == "dflash_config" and "dflash_config.mask_token_id" in keys
    else:
        assert keys == [key]


def test_is_causal_against_the_served_rule(tiny):
    config = _exported(tiny)
    del config["dflash_config"]["causal_layers"]
    config["is_causal"] = True  # one full_attention layer: SGLang serves it bidirectional
    assert _keys(check_sglang(config, tiny.target.facts)) == ["is_causal"]


def test_weights_must_match_the_config(tiny):
    config = _exported(tiny)
    shapes = _shapes(config)
    wider = shapes | {"fc.weight": (192, 3 * 192)}
    assert _keys(check_sglang(config, tiny.target.facts, wider)) == ["dflash_config.target_layer_ids"]
    spec = to_speculators(config, "t")
    assert _keys(check_speculators(spec, tiny.target.facts, wider)) == ["aux_hidden_state_layer_ids"]
    del shapes["layers.0.mlp.down_proj.weight"]
    assert _keys(check_sglang(config, tiny.target.facts, shapes)) == ["model.safetensors"]


SPECULATORS_MORE = [
    ("architecture of the other layout", _set(["DFlashDraftModel"], "architectures"), "architectures"),
    ("not a dflash speculator", _set("eagle3", "speculators_model_type"), "speculators_model_type"),
    ("another algorithm", _set("eagle3", "speculators_config", "algorithm"), "speculators_config.algorithm"),
    ("the target's final layer", _set([2, 6], "aux_hidden_state_layer_ids"), "aux_hidden_state_layer_ids"),
    ("the embedding output", _set([0, 4], "aux_hidden_state_layer_ids"), "aux_hidden_state_layer_ids"),
    ("speculative tokens of another block", _set(15, "speculators_config", "proposal_methods", 0, "speculative_tokens"),
     "speculators_config.proposal_methods[].speculative_tokens"),
    ("no proposal methods", _set([], "speculators_config", "proposal_methods"), "speculators_config.proposal_methods"),
    ("default method missing", _set("tree", "speculators_config", "default_proposal_method"),
     "speculators_config.default_proposal_method"),
    ("no verifier", _drop("speculators_config", "verifier", "name_or_path"),
     "speculators_config.verifier.name_or_path"),
    ("mask id missing", _drop("mask_token_id"), "mask_token_id"),
    ("a draft vocabulary", _set(32000, "draft_vocab_size"), "draft_vocab_size"),
    ("vocabulary of another target", _set(32000, "transformer_layer_config", "vocab_size"),
     "transformer_layer_config.vocab_size"),
    ("sampling from the anchor", _set(True, "sample_from_anchor"), "sample_from_anchor"),
    ("causality not a bool", _set("yes", "sliding_window_non_causal"), "sliding_window_non_causal"),
    ("layer config missing", _drop("transformer_layer_config"), "transformer_layer_config"),
    ("layer count missing", _drop("transformer_layer_config", "num_hidden_layers"),
     "transformer_layer_config.num_hidden_layers"),
]


@pytest.mark.parametrize("what,mutate,key", SPECULATORS_MORE, ids=[r[0] for r in SPECULATORS_MORE])
def test_speculators_checker_names_each_broken_rule(what, mutate, key, tiny):
    spec = to_speculators(_exported(tiny), verifier=tiny.target.model)
    mutate(spec)
    assert _keys(check_speculators(spec, tiny.target.facts)) == [key]


def test_the_message_carries_the_key_and_the_fix(tiny):
    config = _exported(tiny)
    config["dflash_config"]["mask_token_id"] = 5.0
    (v,) = check_sglang(config, tiny.target.facts)
    assert str(v) == f"{v.key}: {v.message}; fix: {v.fix}"
    assert "5.0 is a float" in v.message and "drafter.mask_token_id" in v.fix


# --------------------------------------------------------------------------- the serve commands


def _serving(resolved: ResolvedRecipe) -> Serving:
    return Serving.of(_exported(resolved), resolved.target.facts, resolved.target.model, "/r/export/drafter",
                      "/r/export/drafter-vllm")


@pytest.mark.parametrize(("architecture", "vllm_folder"), [("dflash", "drafter-vllm"), ("dflash2", "drafter")])
def test_hybrid_qwen_target_gets_the_mamba_flag_and_the_reasoning_parser(architecture, vllm_folder):
    s = _serving(_resolved("qwen36_27b.yaml", architecture=architecture))
    argv = sglang_argv(s)
    assert argv[:4] == ["python", "-m", "sglang.launch_server", "--model-path"] and argv[4] == "Qwen/Qwen3.6-27B"
    for flag, value in (("--speculative-algorithm", "DFLASH"), ("--speculative-draft-model-path", "/r/export/drafter"),
                        ("--speculative-num-draft-tokens", "16"), ("--mamba-radix-cache-strategy", "extra_buffer"),
                        ("--reasoning-parser", "qwen3")):
        assert argv[argv.index(flag) + 1] == value
    assert "--speculative-draft-window-size" not in argv  # the seed's drafter does not slide
    vllm = vllm_argv(s)
    assert vllm[:3] == ["vllm", "serve", "Qwen/Qwen3.6-27B"] and vllm[-2:] == ["--reasoning-parser", "qwen3"]
    assert vllm[vllm.index("--speculative-config") + 1] == (
        f'{{"method": "dflash", "model": "/r/export/{vllm_folder}", "num_speculative_tokens": 15}}')
    text = readme(s, _exported(_resolved("qwen36_27b.yaml", architecture=architecture)), "seed", "bf16")
    assert "--mamba-scheduler-strategy" in text  # the old SGLang spelling, named in the notes


def test_dense_and_sliding_drafters_and_other_families(tiny, sliding):
    dense = sglang_argv(_serving(tiny))
    assert "--mamba-radix-cache-strategy" not in dense and "--speculative-draft-window-size" not in dense
    window = sglang_argv(_serving(sliding))
    assert window[window.index("--speculative-draft-window-size") + 1] == "64"
    other = tiny.model_copy(update={"target": tiny.target.model_copy(
        update={"facts": tiny.target.facts.model_copy(update={"model_type": "llama"})})})
    assert "--reasoning-parser" not in sglang_argv(_serving(other)) + vllm_argv(_serving(other))


def test_printed_commands_are_the_argv(sliding):
    s = _serving(sliding)
    text = commands(s)
    sglang, vllm = (block.split("\n", 1)[1] for block in text.strip().split("\n\n"))
    assert shlex.split(sglang.replace("\\\n", " ")) == sglang_argv(s)
    assert shlex.split(vllm.replace("\\\n", " ")) == vllm_argv(s)
    assert shell(vllm_argv(s)).splitlines()[1].startswith("    --speculative-config '{")
