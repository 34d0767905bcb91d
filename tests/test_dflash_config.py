"""The DFlash config built from the resolved drafter and the target, and read back."""

from __future__ import annotations

import pytest
from transformers import Qwen3Config

from dflashx.dflash.config import DFlashConfig
from dflashx.resolve import resolve
from dflashx.targets.read_config import facts_from_config
from helpers_dflash import config_for
from helpers_models import make_recipe


def _target(**kw):
    base = {"vocab_size": 500, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 36,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rope_theta": 5e5}
    return Qwen3Config(**(base | kw))


def _config(drafter: dict, target=None, mask_token: str | None = None) -> DFlashConfig:
    return config_for(target if target is not None else _target(), mask_token, **drafter)


def test_from_target_fills_layer_ids_and_shapes():
    cfg = _config({"num_layers": 2, "block_size": 16, "num_target_layers": 5, "mask_token_id": 7})
    assert cfg.target_layer_ids == [1, 9, 17, 25, 33]
    assert (cfg.hidden_size, cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size) == (64, 2, 16, 96)
    assert cfg.rope_theta == 5e5 and cfg.mask_token_id == 7 and cfg.k == 5
    assert cfg.causal_layers == [False, False]


def test_from_target_reads_qwen3_5_nested_text_config():
    outer = {"model_type": "qwen3_5", "text_config": _target(num_hidden_layers=64).to_dict()}
    cfg = _config({"num_layers": 5, "num_target_layers": 5, "mask_token_id": 9}, outer)
    assert cfg.target_layer_ids == [1, 16, 31, 46, 61] and cfg.num_target_layers == 64


def test_text_config_is_the_planners_rule():
    """The trainer reads a nested config as the planner does (targets.read_config.text_section): the text
    stack's keys win and a key only the wrapper holds is kept (the old rule dropped the wrapper)."""
    from dflashx.dflash.config import text_config
    from dflashx.targets.read_config import text_section

    outer = {"model_type": "qwen3_5", "image_token_id": 42, "vocab_size": 1,
             "text_config": _target(num_hidden_layers=64).to_dict()}
    merged = text_config(outer)
    assert merged == text_section(outer)
    assert merged["image_token_id"] == 42 and merged["vocab_size"] == 500 and merged["num_hidden_layers"] == 64


def test_hf_dict_layout_and_round_trip():
    spec = {"num_layers": 3, "block_size": 10, "target_layer_ids": [2, 20], "mask_token_id": 3,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"], "sliding_window": 64}
    cfg = _config(spec)
    hf = cfg.to_hf_dict()
    assert hf["architectures"] == ["DFlashDraftModel"] and hf["model_type"] == "qwen3"
    assert hf["dflash_config"]["target_layer_ids"] == [2, 20] and hf["dflash_config"]["mask_token_id"] == 3
    assert hf["block_size"] == 10 and hf["num_target_layers"] == 36 and hf["num_hidden_layers"] == 3
    assert hf["dflash_config"]["causal_layers"] == [True, True, False] and "is_causal" not in hf
    assert DFlashConfig.from_hf_dict(hf) == cfg
    qwen3 = cfg.to_qwen3_config()
    assert qwen3.sliding_window == 64 and qwen3.layer_types[0] == "sliding_attention"


def test_public_checkpoint_config_without_causal_list():
    """A z-lab style config.json: top-level block_size, no causal list, no sliding layers."""
    hf = _config({"num_layers": 1, "target_layer_ids": [1]}).to_hf_dict()
    del hf["dflash_config"]["causal_layers"], hf["is_causal"]
    assert DFlashConfig.from_hf_dict(hf).causal_layers == [False]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"target_layer_ids": [1, 40]}, "must lie in"),
        ({"layer_types": ["sliding_attention"]}, "sliding_window"),
        ({"mask_token_id": 999}, "outside the vocabulary"),
    ],
)
def test_incoherent_configs_are_rejected(spec, message):
    with pytest.raises(ValueError, match=message):
        _config({"num_layers": 1} | spec)


def test_mixed_causality_the_engines_cannot_express_is_rejected():
    cfg = _config({"num_layers": 2, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8})
    with pytest.raises(ValueError, match="mixed per-layer causality"):
        DFlashConfig.model_validate(cfg.model_dump() | {"causal_layers": [False, True]})


def test_plan_facts_that_differ_from_the_checkpoint_are_refused():
    resolved = resolve(make_recipe(drafter={"num_layers": 1, "mask_token_id": 3}),
                       facts_from_config(_target().to_dict(), name="t")).drafter
    with pytest.raises(ValueError, match=r"differ from the target's config\.json"):
        DFlashConfig.from_target(resolved, _target(hidden_size=128))
