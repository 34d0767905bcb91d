"""The draft settings each engine takes, in one place: SGLang's flags for the target's MTP head and for a DFlash
drafter folder, vLLM's `--speculative-config` for either. Read by the launch commands (`sglang.py`, `vllm.py`),
the export's serve commands (`dflashx.export.serve`) and the generation estimate's explanation.

SGLang (sgl-project/sglang `server_args.py`): `--speculative-algorithm EAGLE|NEXTN` with `--speculative-num-steps`,
`--speculative-eagle-topk`, `--speculative-num-draft-tokens` for the MTP head; `--speculative-algorithm DFLASH`,
`--speculative-draft-model-path`, `--speculative-num-draft-tokens` (DFLASH's block) and
`--speculative-draft-window-size` (the draft's window) for a DFlash drafter. vLLM (`config/speculative.py`):
`{"method": "mtp", "num_speculative_tokens": num_steps}`, `{"method": "dflash", "model": folder,
"num_speculative_tokens": block - 1}` (vLLM counts the drafted tokens after the anchor)."""

from __future__ import annotations

from typing import Any

from dflashx.resolve.model import ResolvedRecipe


def mtp_flags(recipe: ResolvedRecipe) -> list[str]:
    """SGLang's draft settings for the target's MTP head (stages.generate.serving.speculative)."""
    spec = recipe.stages.generate.serving.speculative
    return ["--speculative-algorithm", spec.algorithm, "--speculative-num-steps", str(spec.num_steps),
            "--speculative-eagle-topk", str(spec.eagle_topk), "--speculative-num-draft-tokens",
            str(spec.num_draft_tokens)]


def dflash_flags(drafter: str, block_size: int, window: int | None) -> list[str]:
    """SGLang's flags for a DFlash drafter folder: the block it was trained with, its window when a layer slides."""
    flags = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", drafter,
             "--speculative-num-draft-tokens", str(block_size)]
    return flags + (["--speculative-draft-window-size", str(window)] if window is not None else [])


def dflash_spec(drafter: str, block_size: int) -> dict[str, Any]:
    """vLLM's `--speculative-config` for a DFlash (or DFlash2) drafter folder."""
    return {"method": "dflash", "model": drafter, "num_speculative_tokens": block_size - 1}


def generation_window(recipe: ResolvedRecipe) -> int | None:
    """The generation drafter's window: this recipe's drafter's, when one of its layers slides."""
    d = recipe.drafter
    return d.sliding_window if "sliding_attention" in d.layer_types else None


def vllm_speculative(recipe: ResolvedRecipe, mtp: bool) -> dict[str, Any] | None:
    """vLLM's `--speculative-config` for generation: the DFlash drafter folder, else (`mtp`) the MTP head."""
    serving = recipe.stages.generate.serving
    if serving.drafter:
        return dflash_spec(serving.drafter, recipe.drafter.block_size)
    if mtp:  # vLLM's MTP method drafts num_steps tokens with the target's head
        return {"method": "mtp", "num_speculative_tokens": serving.speculative.num_steps}
    return None


def sglang_draft(recipe: ResolvedRecipe, mtp: bool) -> list[str]:
    """SGLang's draft flags for generation: the DFlash drafter folder, else (`mtp`) the MTP head, else none."""
    serving = recipe.stages.generate.serving
    if serving.drafter:
        return dflash_flags(serving.drafter, recipe.drafter.block_size, generation_window(recipe))
    return mtp_flags(recipe) if mtp else []


def generation_draft_text(recipe: ResolvedRecipe, mtp: bool) -> str:
    """The generation servers' draft settings as the plan's engine takes them, for the explanation."""
    if recipe.stages.generate.backend == "vllm":
        import json

        return f"--speculative-config '{json.dumps(vllm_speculative(recipe, mtp))}'"
    return " ".join(sglang_draft(recipe, mtp))
