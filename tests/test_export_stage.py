"""The export stage: a DFlash folder the z-lab `dflash` package loads, that decodes like ours, and a
speculators folder for vLLM; both checked against the engines' contracts on every export.

Real files throughout: a tiny random Qwen3 target, a drafter checkpoint written by the checkpoint
module, the stage's output read back by our loader, by both contract checkers and by the z-lab
reference (its PyPI wheel unpacked, not installed: `helpers_reference.zlab_reference`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers_dflash import drafter_config, load_target, tiny_target
from helpers_dflash2 import DFLASH2
from helpers_reference import zlab_reference
from helpers_models import make_recipe, stage_context
from safetensors import safe_open

from dflashx.dflash.checkpoint import load_drafter, load_weights_into, save_drafter
from dflashx.dflash.config import DFlashConfig
from dflashx.dflash.model import DFlashDrafter
from dflashx.dflash.spec_decode import SpecDecoder
from dflashx.export import check_sglang, check_speculators, from_speculators
from dflashx.stages import export as export_stage
from dflashx.stages.base import StageFailed


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return load_target(tiny_target(tmp_path_factory.mktemp("target")))


def _checkpoint(target, path: Path, **spec) -> DFlashDrafter:
    model, tok = target
    torch.manual_seed(0)
    drafter = DFlashDrafter(drafter_config(model, tok, **spec))
    save_drafter(drafter, path)
    return drafter


def _export(tmp_path: Path, checkpoint: Path, target_dir: str | Path, dtype: str = "bf16"):
    """The stage for a recipe whose target is `target_dir` (its facts read from its config.json)."""
    recipe = make_recipe(target={"model": str(target_dir), "precision": "fp32"}, stages={"export": {"dtype": dtype}})
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    ctx = stage_context("export", recipe, run_dir, inputs={"train.checkpoint": checkpoint})
    return ctx, export_stage.run(ctx)


def test_export_writes_the_public_layout_in_the_recipe_dtype(target, tmp_path):
    drafter = _checkpoint(target, tmp_path / "ckpt", num_layers=2)
    ctx, result = _export(tmp_path, tmp_path / "ckpt", target[0].name_or_path)
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
    with pytest.raises(ValueError, match=r"stages\.export\.dtype"):
        _export(tmp_path, tmp_path / "ckpt", target[0].name_or_path, dtype="fp8")
    recipe = make_recipe()
    ctx = stage_context("export", recipe, tmp_path / "run2")
    with pytest.raises(ValueError, match=r"train\.checkpoint"):
        export_stage.run(ctx)


def test_zlab_reference_loads_the_export_and_decodes_as_we_do(target, tmp_path):
    """Same exported weights, same target: the reference's greedy dflash_generate and ours emit the
    same tokens (both must be the target's greedy output)."""
    ref = zlab_reference()
    model, _ = target
    _checkpoint(target, tmp_path / "ckpt")
    ctx, result = _export(tmp_path, tmp_path / "ckpt", model.name_or_path, dtype="fp32")
    out = ctx.out_dir / result.artifacts["drafter"].path
    theirs, info = ref.DFlashDraftModel.from_pretrained(str(out), output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ours = load_drafter(out)
    prompt = [5, 9, 14, 22, 31, 40, 41, 60]
    n = 24
    ref_out = ref.dflash_generate(theirs.eval(), model, torch.tensor([prompt]), n, None, return_stats=False)
    mine = SpecDecoder(model, ours).generate(prompt, n)
    assert ref_out[0, len(prompt):].tolist()[:n] == mine.output_ids


def _folders(ctx, result) -> tuple[Path, Path]:
    return (ctx.out_dir / result.artifacts["drafter"].path, ctx.out_dir / result.artifacts["drafter_vllm"].path)


def test_export_writes_both_layouts_that_pass_both_checkers_and_prints_the_commands(target, tmp_path, capsys):
    model, _ = target
    drafter = _checkpoint(target, tmp_path / "ckpt", num_layers=2, layer_types=["sliding_attention"] * 2,
                          sliding_window=8)  # both layers causal: one causality, which a speculators config can say
    ctx, result = _export(tmp_path, tmp_path / "ckpt", model.name_or_path)
    zlab_dir, vllm_dir = _folders(ctx, result)
    assert vllm_dir.name == "drafter-vllm"
    facts = ctx.recipe.target.facts
    zlab, spec = (json.loads((d / "config.json").read_text()) for d in (zlab_dir, vllm_dir))
    assert check_sglang(zlab, facts) == [] and check_speculators(spec, facts) == []
    assert spec["speculators_model_type"] == "dflash" and spec["aux_hidden_state_layer_ids"] == [2, 3]
    assert spec["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert spec["speculators_config"]["verifier"]["name_or_path"] == model.name_or_path
    assert (vllm_dir / "model.safetensors").read_bytes() == (zlab_dir / "model.safetensors").read_bytes()

    # round trip: the speculators folder's config and weights load back into the same drafter
    back = DFlashDrafter(DFlashConfig.from_hf_dict(from_speculators(spec, facts.num_layers)))
    load_weights_into(back, vllm_dir)
    assert back.config.model_dump(exclude={"mask_token"}) == drafter.config.model_dump(exclude={"mask_token"})
    for name, value in drafter.state_dict().items():
        assert torch.equal(back.state_dict()[name], value.to(torch.bfloat16).float()), name

    printed = capsys.readouterr().out
    for readme in ((zlab_dir / "README.md").read_text(), (vllm_dir / "README.md").read_text(), printed):
        assert f"--speculative-draft-model-path {zlab_dir}" in readme and "--speculative-num-draft-tokens 4" in readme
        assert "--speculative-draft-window-size 8" in readme  # the drafter slides
        assert f'"model": "{vllm_dir}", "num_speculative_tokens": 3' in readme
        assert f"vllm serve {model.name_or_path}" in readme
        assert "--mamba-radix-cache-strategy" not in readme  # dense target


def test_a_drafter_whose_layers_differ_in_causality_gets_one_folder_that_vllm_serves(target, tmp_path):
    """A sliding layer causal and a full one bidirectional: vLLM reads a speculators config's one causality flag for
    every layer (`update_dflash`), so no speculators folder is written and the vLLM command loads the DFlash one,
    whose causality vLLM derives per layer from layer_types."""
    model, _ = target
    _checkpoint(target, tmp_path / "ckpt", num_layers=2, layer_types=["sliding_attention", "full_attention"],
                sliding_window=8)
    ctx, result = _export(tmp_path, tmp_path / "ckpt", model.name_or_path)
    zlab_dir = ctx.out_dir / "drafter"
    assert "drafter_vllm" not in result.artifacts and not (ctx.out_dir / "drafter-vllm").exists()
    assert check_sglang(json.loads((zlab_dir / "config.json").read_text()), ctx.recipe.target.facts) == []
    readme = (zlab_dir / "README.md").read_text()
    assert f'"model": "{zlab_dir}", "num_speculative_tokens": 3' in readme
    assert "One folder" in readme and "drafter-vllm" not in readme


def test_a_dflash2_export_writes_one_folder_and_its_readme_says_dflash2(target, tmp_path, capsys):
    model, _ = target
    _checkpoint(target, tmp_path / "ckpt", num_layers=2, **DFLASH2)
    ctx, result = _export(tmp_path, tmp_path / "ckpt", model.name_or_path)
    out = ctx.out_dir / result.artifacts["drafter"].path
    assert "drafter_vllm" not in result.artifacts and not (ctx.out_dir / "drafter-vllm").exists()
    readme, printed = (out / "README.md").read_text(), capsys.readouterr().out
    assert readme.splitlines()[0].endswith(": DFlash2 drafter") and "One folder" in readme
    assert "Two folders" not in readme and "drafter-vllm" not in readme
    assert "from dflash.model import DFlash2DraftModel" in readme
    for text in (readme, printed):
        assert f"VLLM_USE_V2_MODEL_RUNNER=1 vllm serve {model.name_or_path}" in text
        assert f'"model": "{out}", "num_speculative_tokens": 3' in text


def test_a_checkpoint_trained_for_another_target_stops_the_export_naming_the_keys(target, tmp_path):
    """The recipe's target has 4 layers; this checkpoint says it taps layer 6 of an 8-layer target."""
    model, _ = target
    _checkpoint(target, tmp_path / "ckpt")
    config_file = tmp_path / "ckpt" / "config.json"
    config = json.loads(config_file.read_text())
    config["num_target_layers"], config["dflash_config"]["target_layer_ids"] = 8, [1, 6]
    config_file.write_text(json.dumps(config))
    with pytest.raises(StageFailed) as caught:
        _export(tmp_path, tmp_path / "ckpt", model.name_or_path)
    message = str(caught.value)
    for key in ("num_target_layers", "dflash_config.target_layer_ids", "aux_hidden_state_layer_ids"):
        assert f"  - {key}: " in message, key
    assert "drafter.target_layer_ids" in message and "entries [6] are not integers in [0, 4)" in message
    assert caught.value.metrics["contract_violations"] == 3


def test_the_tiny_recipes_export_passes_both_checkers(tmp_path):
    """The embedded default's drafter (its shape, taps and mask from recipes/tiny.yaml, on the built
    tiny target), exported by the stage under the tiny recipe itself: both contracts hold."""
    from helpers_models import resolved

    from dflashx.config.load import load_recipe
    from dflashx.targets.locate import locate_target

    recipe = resolved(load_recipe(Path(__file__).resolve().parents[1] / "recipes" / "tiny.yaml").recipe)
    target_dir = locate_target(recipe.target)
    config = DFlashConfig.from_target(recipe.drafter, json.loads((target_dir / "config.json").read_text()))
    torch.manual_seed(0)
    save_drafter(DFlashDrafter(config), tmp_path / "ckpt")
    ctx = stage_context("export", recipe, tmp_path / "run", inputs={"train.checkpoint": tmp_path / "ckpt"})
    zlab_dir, vllm_dir = _folders(ctx, export_stage.run(ctx))
    facts = recipe.target.facts
    assert check_sglang(json.loads((zlab_dir / "config.json").read_text()), facts) == []
    assert check_speculators(json.loads((vllm_dir / "config.json").read_text()), facts) == []
    readme = (zlab_dir / "README.md").read_text()
    assert "--speculative-num-draft-tokens 8" in readme and "--reasoning-parser qwen3" in readme
    assert '"num_speculative_tokens": 7' in readme and f"--model-path {target_dir}" in readme  # the built target
