"""The export stage: the trained drafter as a servable DFlash folder.

Reads `train.checkpoint`; writes `drafter/` holding config.json (`architectures:
["DFlashDraftModel"]`, `block_size`, `dflash_config: {mask_token_id, target_layer_ids, ...}`,
`num_target_layers`, `layer_types`, the Qwen3 fields), model.safetensors (the public DFlash
parameter names, in `stages.export.dtype`) and README.md with the SGLang serve command. The folder
is what the z-lab `dflash` package loads (`DFlashDraftModel.from_pretrained`) and what SGLang takes
as `--speculative-draft-model-path` with `--speculative-algorithm DFLASH`; `drafter.init_from`
accepts it to continue training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dflashx.config.fields import TORCH_DTYPE
from dflashx.stages.base import Artifact, StageContext, StageResult
from dflashx.stages.graph import input_name
from dflashx.store.atomic import atomic_write_text

CHECKPOINT = input_name("export")
OUT = "drafter"

README = """# {name}: DFlash drafter

Block-diffusion drafter (DFlash, arXiv 2602.06036) for `{target}`, trained by dflashx.

| | |
|---|---|
| block size | {block_size} |
| drafter layers | {num_layers} ({layer_types}) |
| target layers tapped | {target_layer_ids} of {num_target_layers} (layer l = output of decoder layer l) |
| mask token id | {mask_token_id} |
| weights | model.safetensors, {dtype} |

## Serve with SGLang

```bash
python -m sglang.launch_server \\
    --model-path {target} \\
    --speculative-algorithm DFLASH \\
    --speculative-draft-model-path {path} \\
    --speculative-num-draft-tokens {block_size}
```

`--speculative-num-draft-tokens` is the block size the drafter was trained with. The target's
embedding and LM head are shared with the drafter at serve time; they are not in this folder.

## Load in Python

```python
from dflash.model import DFlashDraftModel  # z-lab `dflash` package
draft = DFlashDraftModel.from_pretrained("{path}", dtype="auto")
```
"""


def write_readme(ctx: StageContext, drafter_dir: Path, config: Any, dtype: str) -> Path:
    text = README.format(
        name=ctx.recipe.name, target=ctx.recipe.target.model, block_size=config.block_size,
        num_layers=config.num_layers, layer_types=", ".join(config.layer_types),
        target_layer_ids=config.target_layer_ids, num_target_layers=config.num_target_layers,
        mask_token_id=config.mask_token_id, dtype=dtype, path=str(drafter_dir),
    )
    path = drafter_dir / "README.md"
    atomic_write_text(path, text)
    return path


def run(ctx: StageContext) -> StageResult:
    from dflashx.dflash.checkpoint import load_drafter, save_drafter

    if CHECKPOINT not in ctx.inputs:
        raise ValueError(f"export stage needs input `{CHECKPOINT}` (the train stage's drafter); enable stages.train")
    import torch

    dtype = getattr(torch, TORCH_DTYPE[ctx.config.dtype])
    drafter = load_drafter(ctx.inputs[CHECKPOINT])
    out = ctx.out_dir / OUT
    save_drafter(drafter, out, dtype=dtype)
    write_readme(ctx, out, drafter.config, ctx.config.dtype)
    params = sum(p.numel() for p in drafter.parameters())
    return StageResult(
        artifacts={OUT: Artifact(OUT, tier="irreplaceable", description="DFlash drafter: config.json + model.safetensors")},
        metrics={"parameters": params, "bytes": sum(f.stat().st_size for f in out.iterdir())},
    )
