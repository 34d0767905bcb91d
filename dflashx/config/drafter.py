"""The drafter section of the recipe: DFlash or DFlash2, and the names their checkpoints carry.

DFlash (arXiv 2602.06036) is the block-diffusion drafter; DFlash2 (Z Lab and Inco AI, 2026-08-18)
keeps its backbone, inputs and chain verification and adds two modules: a grouped dynamic causal
convolution around each sublayer and a pairwise path selector over the top-k of the unary logits.
The DFlash2 defaults are the published checkpoints' (z-lab/Qwen3.8-27B-DFlash2: kernel 2, groups of
16 channels, selector rank 256, top-16). Whether a DFlash2 key fits the target (a group size that
divides the hidden size) is a plan rule: the target's shapes are not known here.
"""

# No `from __future__ import annotations` here: pydantic would evaluate every field's string
# annotation when the class is created, which `dflashx plan`'s start-up pays (benchmarks/cli_latency.py).

from typing import Literal

from pydantic import Field

from dflashx.config.fields import OUTPUT, PATH, Strict

Architecture = Literal["dflash", "dflash2"]
# The `architectures` entry of each exported config.json: what the z-lab reference, SGLang and vLLM
# dispatch on. Defined here once; export, checkpoint and the contract checks read it.
HF_ARCHITECTURE: dict[str, str] = {"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel"}
# DFlash2's own drafter keys, as the recipe, DFlashConfig and the exported `dflash_config` all name them.
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


class DrafterSpec(Strict):
    """DFlash block-diffusion drafter (arXiv 2602.06036), or DFlash2 (`architecture: dflash2`)."""

    architecture: Architecture = Field(
        "dflash",
        description="`dflash`: the DFlash drafter; `dflash2`: DFlash2, the same backbone with a grouped dynamic "
                    "causal convolution around each sublayer and a pairwise path selector over the top-k drafted "
                    "tokens (the drafter SGLang and vLLM serve as DFlash2DraftModel).",
        json_schema_extra=OUTPUT,
    )
    num_layers: int = Field(5, ge=1, description="Transformer layers of the drafter.", json_schema_extra=OUTPUT)
    block_size: int = Field(16, ge=2, description="Anchor + (B-1) mask tokens (at least 2: one to draft).",
                            json_schema_extra=OUTPUT)
    num_target_layers: int = Field(5, ge=1, description="k target layers fused by `fc`.", json_schema_extra=OUTPUT)
    target_layer_ids: list[int] | None = Field(
        None, description="Explicit target layer ids; default spreads k over the target.", json_schema_extra=OUTPUT
    )
    mask_token_id: int | None = Field(None, description="Unused embedding row; default from the target.",
                                      json_schema_extra=OUTPUT)
    layer_types: list[Literal["full_attention", "sliding_attention"]] | None = Field(
        None, description="Attention type per drafter layer; default: all full attention.", json_schema_extra=OUTPUT
    )
    sliding_window: int | None = Field(
        None, ge=1, description="Window of `sliding_attention` layers, tokens.", json_schema_extra=OUTPUT
    )
    intermediate_size: int | None = Field(None, ge=1, description="Default: the target's FFN size.",
                                          json_schema_extra=OUTPUT)
    init_from: str | None = Field(None, description="Folder of a DFlash checkpoint to continue training.",
                                  json_schema_extra=PATH)
    precision: Literal["bf16", "fp8"] = Field(
        "bf16",
        description="Matmuls of the drafter's linear layers in training: `fp8` runs them in float8 with row-wise "
                    "scales (torchao float8 training; Hopper or Blackwell GPUs, the plan checks the profile); "
                    "weights, optimizer states and the exported drafter stay bf16.",
        json_schema_extra=OUTPUT,
    )
    conv_kernel_size: int = Field(
        2, ge=1, description="DFlash2: taps of the grouped dynamic causal convolution (a tap never reaches across "
        "the start of a block).", json_schema_extra=OUTPUT)
    conv_group_size: int = Field(
        16, ge=1, description="DFlash2: channels per group that share one dynamic kernel value; must divide the "
        "hidden size.", json_schema_extra=OUTPUT)
    selector_rank: int = Field(
        256, ge=1, description="DFlash2: rank r of the path selector's two V x r codebooks and its hidden "
        "projection.", json_schema_extra=OUTPUT)
    selector_top_k: int = Field(
        16, ge=2, description="DFlash2: candidates per block position the selector chooses among (the top-k of the "
        "unary logits).", json_schema_extra=OUTPUT)
