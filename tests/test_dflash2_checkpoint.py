"""DFlash2's config.json in the published layout and its checkpoint's parameter names: written,
read back (ours and a published-style config), and the causality rule (every layer bidirectional,
`is_causal: false`)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from test_dflash_config import _config

from dflashx.config.drafter import HF_ARCHITECTURE
from dflashx.dflash.checkpoint import load_drafter, save_drafter
from dflashx.dflash.config import DFlashConfig
from dflashx.dflash.model import DFlashDrafter

SLIDING = {"num_layers": 3, "block_size": 8, "target_layer_ids": [2, 20], "mask_token_id": 3,
           "layer_types": ["sliding_attention"] * 2 + ["full_attention"], "sliding_window": 64}
DFLASH2 = SLIDING | {"architecture": "dflash2", "selector_rank": 32, "selector_top_k": 8}


def test_dflash2_config_json_is_the_published_layout_and_reads_back():
    cfg = _config(DFLASH2)
    assert cfg.causal_layers == [False] * 3  # sliding layers too: DFlash2 is bidirectional in a block
    hf = cfg.to_hf_dict()
    assert hf["architectures"] == [HF_ARCHITECTURE["dflash2"]] == ["DFlash2DraftModel"]
    assert hf["is_causal"] is False and hf["layer_types"][0] == "sliding_attention"
    assert {k: hf["dflash_config"][k] for k in ("block_size", "conv_kernel_size", "conv_group_size", "selector_rank",
                                                "selector_top_k", "mask_token_id", "target_layer_ids")} == {
        "block_size": 8, "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 32, "selector_top_k": 8,
        "mask_token_id": 3, "target_layer_ids": [2, 20]}
    assert DFlashConfig.from_hf_dict(hf) == cfg
    dflash = _config(SLIDING).to_hf_dict()  # DFlash keeps its layout: sliding layers causal, no DFlash2 key
    assert dflash["architectures"] == ["DFlashDraftModel"] and "is_causal" not in dflash
    assert not {"conv_kernel_size", "selector_rank", "block_size"} & dflash["dflash_config"].keys()


def test_a_published_style_dflash2_config_reads():
    """z-lab/Qwen3.8-27B-DFlash2's layout: the DFlash2 keys and block size only in dflash_config,
    is_causal false, no causal list."""
    hf = _config(DFLASH2).to_hf_dict()
    del hf["block_size"], hf["dflash_config"]["causal_layers"]
    cfg = DFlashConfig.from_hf_dict(hf)
    assert (cfg.architecture, cfg.block_size, cfg.selector_rank, cfg.selector_top_k) == ("dflash2", 8, 32, 8)
    assert cfg.causal_layers == [False] * 3
    del hf["is_causal"]  # the engines would then make the sliding layers causal: not what DFlash2 trains
    with pytest.raises(ValueError, match="bidirectional"):
        DFlashConfig.from_hf_dict(hf)
    hf["is_causal"] = False
    del hf["dflash_config"]["selector_rank"]  # the reference has no default for it
    with pytest.raises(KeyError):
        DFlashConfig.from_hf_dict(hf)


def test_a_causal_dflash2_layer_is_refused():
    cfg = _config(DFLASH2)
    with pytest.raises(ValueError, match="bidirectional"):
        DFlashConfig.model_validate(cfg.model_dump() | {"causal_layers": [True, True, False]})


def test_selector_codebooks_are_saved_without_weight_suffix_and_load_back(tmp_path):
    cfg = _config({"num_layers": 1, "architecture": "dflash2", "selector_rank": 8, "selector_top_k": 4})
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg)
    with torch.no_grad():
        drafter.candidate_selector.successor_codebook.weight.normal_()
        drafter.layers[0].mlp_conv.kernel_projection.weight.normal_()
    save_drafter(drafter, tmp_path / "d")
    keys = load_file(str(tmp_path / "d" / "model.safetensors")).keys()
    assert {"candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook",
            "candidate_selector.hidden_projection.weight", "layers.0.attention_conv.base_kernel",
            "layers.0.mlp_conv.kernel_projection.weight"} <= keys
    assert not any(k.endswith("codebook.weight") for k in keys)
    assert json.loads((tmp_path / "d" / "config.json").read_text())["architectures"] == ["DFlash2DraftModel"]
    loaded = load_drafter(tmp_path / "d")
    assert loaded.config == cfg
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in drafter.state_dict().items())
