"""The export stage: a DFlash folder the z-lab `dflash` package loads, that decodes like ours.

Real files throughout: a tiny random Qwen3 target, a drafter checkpoint written by the checkpoint
module, the stage's output read back by our loader and by the z-lab reference (its PyPI wheel unpacked,
not installed: `helpers_dflash.zlab_reference`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers_dflash import drafter_config, load_target, tiny_target, zlab_reference
from helpers_models import make_recipe, stage_context
from safetensors import safe_open

from dflashx.dflash.checkpoint import load_drafter, save_drafter
from dflashx.dflash.model import DFlashDrafter
from dflashx.dflash.spec_decode import SpecDecoder
from dflashx.stages import export as export_stage



@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return load_target(tiny_target(tmp_path_factory.mktemp("target")))


def _checkpoint(target, path: Path, **spec) -> DFlashDrafter:
    model, tok = target
    torch.manual_seed(0)
    drafter = DFlashDrafter(drafter_config(model, tok, **spec))
    save_drafter(drafter, path)
    return drafter


def _export(tmp_path: Path, checkpoint: Path, dtype: str = "bf16"):
    recipe = make_recipe(stages={"export": {"dtype": dtype}})
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    ctx = stage_context("export", recipe, run_dir, inputs={"train.checkpoint": checkpoint})
    return ctx, export_stage.run(ctx)


def test_export_writes_the_public_layout_in_the_recipe_dtype(target, tmp_path):
    drafter = _checkpoint(target, tmp_path / "ckpt", num_layers=2)
    ctx, result = _export(tmp_path, tmp_path / "ckpt")
    out = ctx.out_dir / result.artifacts["drafter"].path
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == 4
    assert cfg["dflash_config"]["mask_token_id"] == drafter.config.mask_token_id
    assert cfg["dflash_config"]["target_layer_ids"] == [1, 2] and cfg["num_target_layers"] == 4
    assert cfg["layer_types"] == ["full_attention"] * 2 and cfg["num_hidden_layers"] == 2
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert {f.get_tensor(k).dtype for k in keys} == {torch.bfloat16}
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.1.self_attn.q_proj.weight",
            "layers.0.mlp.down_proj.weight"} <= keys
    assert not any("embed" in k or "lm_head" in k for k in keys)
    back = load_drafter(out)
    for name, value in drafter.state_dict().items():
        assert torch.equal(back.state_dict()[name], value.to(torch.bfloat16).float()), name
    readme = (out / "README.md").read_text()
    assert "--speculative-algorithm DFLASH" in readme and f"--speculative-draft-model-path {out}" in readme
    assert "--speculative-num-draft-tokens 4" in readme
    assert result.metrics["parameters"] == sum(p.numel() for p in drafter.parameters())


def test_export_refuses_fp8_and_a_missing_checkpoint(target, tmp_path):
    _checkpoint(target, tmp_path / "ckpt")
    with pytest.raises(ValueError, match="stages.export.dtype"):
        _export(tmp_path, tmp_path / "ckpt", dtype="fp8")
    recipe = make_recipe()
    ctx = stage_context("export", recipe, tmp_path / "run2")
    with pytest.raises(ValueError, match="train.checkpoint"):
        export_stage.run(ctx)


def test_zlab_reference_loads_the_export_and_decodes_as_we_do(target, tmp_path):
    """Same exported weights, same target: the reference's greedy dflash_generate and ours emit the
    same tokens (both must be the target's greedy output)."""
    ref = zlab_reference()
    model, _ = target
    _checkpoint(target, tmp_path / "ckpt")
    ctx, result = _export(tmp_path, tmp_path / "ckpt", dtype="fp32")
    out = ctx.out_dir / result.artifacts["drafter"].path
    theirs, info = ref.DFlashDraftModel.from_pretrained(str(out), output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ours = load_drafter(out)
    prompt = [5, 9, 14, 22, 31, 40, 41, 60]
    n = 24
    ref_out = ref.dflash_generate(theirs.eval(), model, torch.tensor([prompt]), n, None, return_stats=False)
    mine = SpecDecoder(model, ours).generate(prompt, n)
    assert ref_out[0, len(prompt):].tolist()[:n] == mine.output_ids
