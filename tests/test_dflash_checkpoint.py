"""Export in the public DFlash layout: round trip, parameter names, the z-lab reference loads it
and computes the same block, and continuing from a checkpoint folder."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from dflashx.dflash.checkpoint import load_drafter, load_weights_into, save_drafter
from dflashx.dflash.masks import DraftMask
from dflashx.dflash.model import DFlashDrafter
from helpers_dflash import drafter_config, load_target, tiny_target
from helpers_reference import zlab_reference



@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return load_target(tiny_target(tmp_path_factory.mktemp("target")))


def _drafter(target, **spec):
    model, tok = target
    torch.manual_seed(1)
    return DFlashDrafter(drafter_config(model, tok, **spec))


def test_round_trip_gives_the_same_outputs(target, tmp_path):
    model, _ = target
    d = _drafter(target, num_layers=2)
    out = save_drafter(d, tmp_path / "export")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    loaded = load_drafter(out)
    feats = torch.randn(1, 9, 128)
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    drafts = [m.draft_block(m.extend_context(None, feats), 42, embed, head) for m in (d, loaded)]
    assert torch.equal(*drafts)


def test_weights_hold_only_drafter_parameters_with_public_names(target, tmp_path):
    save_drafter(_drafter(target), tmp_path / "e", dtype=torch.bfloat16)
    keys = load_file(str(tmp_path / "e" / "model.safetensors"))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_proj.weight",
            "layers.0.self_attn.k_norm.weight", "layers.0.mlp.gate_proj.weight"} <= set(keys)
    assert not any("embed" in k or "lm_head" in k or "rotary" in k for k in keys)
    assert all(v.dtype == torch.bfloat16 for v in keys.values())
    assert json.loads((tmp_path / "e" / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_load_rejects_a_mismatched_checkpoint(target, tmp_path):
    save_drafter(_drafter(target, num_layers=2), tmp_path / "two")
    with pytest.raises(ValueError, match="do not fit this drafter"):
        load_weights_into(_drafter(target, num_layers=1), tmp_path / "two")


def test_zlab_reference_loads_our_export_and_agrees(target, tmp_path):
    DFlashDraftModel = zlab_reference().DFlashDraftModel
    model, _ = target
    d = _drafter(target, num_layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=6)
    save_drafter(d, tmp_path / "export")
    ref, info = DFlashDraftModel.from_pretrained(str(tmp_path / "export"), output_loading_info=True,
                                                 dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert ref.target_layer_ids == d.config.target_layer_ids and ref.block_size == d.config.block_size
    assert ref.mask_token_id == d.config.mask_token_id
    t, b = 10, d.config.block_size
    feats = torch.randn(1, t, 128)
    ids = torch.tensor([[7] + [d.config.mask_token_id] * (b - 1)])
    emb = model.get_input_embeddings()(ids)
    with torch.no_grad():
        theirs = ref(position_ids=torch.arange(t + b)[None], noise_embedding=emb, target_hidden=feats)
        ours = d(emb, d.fuse(feats), torch.arange(t, t + b)[None], torch.arange(t)[None],
                 DraftMask(torch.tensor([[t]]), t, b))
    assert torch.allclose(theirs, ours, atol=1e-5)
