"""Target facts: the registry's numbers, config.json parsing (incl. qwen3_5's nested text_config)."""

from __future__ import annotations

import pytest

from dflashx.targets.read_config import ConfigFactsError, facts_from_config
from dflashx.targets.registry import BUILTIN, REGISTRY, lookup


def qwen36_config() -> dict:
    """The text part of Qwen/Qwen3.6-27B's config.json as published (multimodal wrapper)."""
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "text_config": {
            "model_type": "qwen3_5_text", "num_hidden_layers": 64, "hidden_size": 5120,
            "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 17408,
            "vocab_size": 248320, "max_position_embeddings": 262144, "full_attention_interval": 4,
            "attn_output_gate": True, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
            "mtp_num_hidden_layers": 1, "tie_word_embeddings": False,
        },
        "vision_config": {"depth": 27, "hidden_size": 1152},
    }


def test_qwen36_facts_match_the_issue():
    f = lookup("Qwen/Qwen3.6-27B")
    assert (f.num_layers, f.num_kv_layers, f.num_linear_layers) == (64, 16, 48)
    assert f.types[:4] == ["linear_attention"] * 3 + ["full_attention"]
    assert f.kv_bytes_per_token(2) == 65_536
    assert f.recurrent_state_bytes == pytest.approx(154e6, rel=0.01)
    assert f.total_params * 2 == pytest.approx(55.6e9, rel=0.001)
    # computed text-stack parameters land near the published count (which adds MTP + vision)
    assert f.params_through_layer(63) + f.embedding_params == pytest.approx(27.8e9, rel=0.05)
    assert f.mask_token_id == 248_070 and f.max_position_embeddings == 262_144 and f.mtp_layers == 1


def test_nested_text_config_reads_like_the_registry():
    facts = facts_from_config(qwen36_config(), name="Qwen/Qwen3.6-27B")
    assert facts.model_dump(exclude={"num_params", "mask_token_id"}) == REGISTRY["Qwen/Qwen3.6-27B"].model_dump(
        exclude={"num_params", "mask_token_id"})


def test_plain_qwen3_config_and_defaults():
    cfg = {"model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
           "max_position_embeddings": 40960, "sliding_window": 32768, "use_sliding_window": False}
    facts = facts_from_config(cfg, name="local")
    assert facts.sliding_window is None and facts.num_kv_layers == 36 and facts.recurrent_state_bytes == 0
    assert facts.kv_bytes_per_token(2) == 2 * 36 * 8 * 128 * 2
    # 8B: computed parameters agree with the published count
    assert facts.total_params == pytest.approx(lookup("Qwen/Qwen3-8B").total_params, rel=0.02)
    no_head_dim = facts_from_config({k: v for k, v in cfg.items() if k != "head_dim"})
    assert no_head_dim.head_dim == 4096 // 32


def test_qwen3_32b_params_consistent():
    f = lookup("Qwen/Qwen3-32B")
    assert f.params_through_layer(f.num_layers - 1) + f.embedding_params == pytest.approx(f.total_params, rel=0.02)


def test_missing_fields_are_named():
    with pytest.raises(ConfigFactsError, match="num_hidden_layers, hidden_size"):
        facts_from_config({"model_type": "x", "num_attention_heads": 2, "intermediate_size": 8, "vocab_size": 10})


def test_layer_types_length_checked():
    with pytest.raises(ValueError, match="layer_types has 2 entries"):
        facts_from_config({"num_hidden_layers": 3, "hidden_size": 8, "num_attention_heads": 2,
                           "intermediate_size": 16, "vocab_size": 10, "layer_types": ["full_attention"] * 2})


def test_lookup_aliases_and_unknown():
    assert lookup("qwen3-8b") is REGISTRY["Qwen/Qwen3-8B"]
    assert lookup("Qwen/Qwen3.5-27B") is REGISTRY["Qwen/Qwen3.6-27B"]
    assert lookup("someone/unknown-model") is None
    assert lookup("builtin:tiny-nothing") is None


@pytest.mark.parametrize("variant", ["tiny-qwen3", "tiny-qwen3_5"])
def test_builtin_tiny_facts_equal_the_tiny_builder(variant):
    """The registry copies dflashx/tiny/build.py's exact configs; this keeps the copy honest."""
    from dflashx.tiny import build
    cfg = {**build.model_config(variant), "mask_token_id": build.MASK_TOKEN_ID}
    assert facts_from_config(cfg, name=f"builtin:{variant}") == BUILTIN[f"builtin:{variant}"]


def test_builtin_tiny_moe_facts_equal_the_upcycled_config():
    from dflashx.tiny import build, moe
    cfg = {**moe.moe_config(), "mask_token_id": build.MASK_TOKEN_ID}
    facts = BUILTIN["builtin:tiny-qwen3_moe"]
    assert facts_from_config(cfg, name="builtin:tiny-qwen3_moe") == facts
    assert facts.is_moe and facts.num_moe_layers == 6 and facts.dense_layer_ids == []


def test_local_target_facts_read_mask_thinking_and_template_tokens(tmp_path):
    """A local folder's tokenizer gives the mask token, the thinking mode and the template's own
    special tokens; a mask id that is one of those is refused at plan time."""
    from dflashx.config.schema import TargetSpec
    from dflashx.plan.plan import make_plan
    from dflashx.targets.facts import facts_for
    from helpers_dflash import tiny_target
    from helpers_models import make_recipe
    from transformers import AutoTokenizer

    folder = tiny_target(tmp_path / "target")
    tok = AutoTokenizer.from_pretrained(folder)
    facts = facts_for(TargetSpec(model=str(folder)))
    assert facts.mask_token_id == tok.convert_tokens_to_ids("<|mask|>") and facts.thinking
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert im_end in facts.template_token_ids and facts.mask_token_id not in facts.template_token_ids
    recipe = make_recipe(target={"model": str(folder)}, drafter={"num_layers": 1, "block_size": 4,
                                                                   "num_target_layers": 2, "mask_token_id": im_end})
    assert "mask_token_special" in [f.code for f in make_plan(recipe, facts).errors]
    fine = make_recipe(target={"model": str(folder)},
                       drafter={"num_layers": 1, "block_size": 4, "num_target_layers": 2})
    assert "mask_token_special" not in [f.code for f in make_plan(fine, facts).errors]


@pytest.mark.parametrize("name", [*REGISTRY, *BUILTIN])
def test_params_through_layer_is_the_layer_by_layer_sum(name):
    """`params_through_layer` prices each kind of layer once (start-up: the planner asks ~100 times);
    it must stay the sum of `layer_params` over the layers, whatever a layer's params come to depend on."""
    f = REGISTRY.get(name) or BUILTIN[name]
    variants = [f]
    if f.is_moe:  # MoE layers mixed with dense ones (`mlp_only_layers`)
        variants.append(f.model_copy(update={"dense_layer_ids": [0, f.num_layers - 1],
                                             "intermediate_size": f.intermediate_size or 64}))
    for facts in variants:
        for last in {0, 1, facts.num_layers // 2, facts.num_layers - 1, facts.num_layers + 3}:
            for active in (False, True):
                layers = range(min(last + 1, facts.num_layers))
                assert facts.params_through_layer(last, active) == sum(facts.layer_params(i, active) for i in layers)


def test_stop_ids_read_off_the_folder_are_the_loaded_models(tmp_path):
    """`targets.load.stop_ids` reads the generation config off the target's folder (a process that never
    loads the model, the train stage's τ probe slice, stops where the eval stage does): the tokenizer's
    eos, the generation config's eos ids (a list there kept whole) and <|im_end|>; without a
    generation_config.json, what transformers derives from config.json when it loads the model."""
    import json

    from dflashx.config.schema import TargetSpec
    from dflashx.targets.load import load_model, load_tokenizer, stop_ids
    from helpers_dflash import tiny_target

    folder = tiny_target(tmp_path / "target", layers=1)
    spec = TargetSpec(model=str(folder))
    tok = load_tokenizer(spec)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    saved = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps(saved | {"eos_token_id": [tok.eos_token_id, 7]}))
    model = load_model(spec, "fp32")
    assert stop_ids(spec, tok) == sorted({tok.eos_token_id, 7, im_end})
    assert 7 in model.generation_config.eos_token_id  # the loaded model reads the same file
    (folder / "generation_config.json").unlink()
    derived = load_model(spec, "fp32").generation_config.eos_token_id
    assert stop_ids(spec, tok) == sorted({tok.eos_token_id, im_end, derived}) and 7 not in stop_ids(spec, tok)
