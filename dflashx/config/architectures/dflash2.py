"""DFlash2 (Z Lab and Inco AI, 2026-08-18): DFlash's backbone, inputs and chain verification, plus a grouped dynamic
causal convolution around each sublayer and a pairwise path selector over the top-k of the unary logits.

Its keys' defaults are the published checkpoints' (z-lab/Qwen3.8-27B-DFlash2: kernel 2, groups of 16 channels,
selector rank 256, top-16). Whether a key fits the target (a group size that divides the hidden size) is one of its
plan checks (`checks`): the target's shapes are not known to the recipe. Its torch half is `dflashx.dflash.dflash2`,
its export half `dflashx.export.dflash2` (the published DFlash2 layout; no speculators form).

Sources of the checks: the modules (`dflash.dflash2`, the reference's and vLLM PR #52816's `qwen3_dflash2.py`,
which both raise when `conv_group_size` does not divide `hidden_size`); the selector takes the top-k of the V unary
logits (vLLM `compute_candidates`), so k cannot exceed V; the FP8 filter of `dflash.kernels._fp8_sized` (torchao
float8 only for linears whose both sizes are multiples of 16). No check on `selector_rank`: vLLM's scores are a
plain einsum over any rank (`_score_edges`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pydantic import Field

from dflashx.config.architectures.spec import (ArchitectureSpec, EngineSupport, Issue, ModuleFigures,
                                               PublishedAcceptance, Shapes)
from dflashx.config.fields import OUTPUT, Strict

NAME = "dflash2"
FP8_ALIGN = 16  # torchao float8 matmuls: both sizes of a linear a multiple of 16 (dflash/kernels.py FP8_ALIGN)
PUBLISHED = PublishedAcceptance(
    (5.46,), "huggingface.co/z-lab/Qwen3.8-27B-DFlash2 (model card), reproduced 5.37 in xllm #2279",
    "mean acceptance length 5.46 on GSM8K",
    "Qwen3.8-27B + its DFlash2 drafter (block 8, 5 sliding-window layers of window 2048, top-16, rank 256); "
    "for comparison vllm-project/speculators issue #1014 quotes Qwen3.5-4B MTP / DFlash / DFlash2 at 4.78 / 4.99 "
    "/ 6.20 (GSM8K) and 5.04 / 5.42 / 6.76 (MATH-500): about +21% over DFlash for about +1.3% cycle latency")
PUBLISHED_BLOCK = 8


class DFlash2Keys(Strict):
    """DFlash2's own drafter keys, as the recipe, DFlashConfig and the exported `dflash_config` all name them."""

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


@dataclass(frozen=True)
class DFlash2Figures(ModuleFigures):
    """DFlash2's modules: per layer two convolutions (`attention_conv`, `mlp_conv`), each a kernel projection
    Linear(h -> 2 K G) and a base kernel [2, K, h]; the selector's two V x r codebooks and its Linear(h -> r)."""

    conv_groups: int = 0  # G = h / conv_group_size channel groups
    conv_projection_params: int = 0  # one convolution's kernel projection
    conv_base_params: int = 0  # one convolution's base kernel
    conv_params: int = 0  # all convolutions
    codebook_params: int = 0  # predecessor_codebook + successor_codebook
    selector_projection_params: int = 0  # hidden_projection

    @property
    def selector_params(self) -> int:
        return self.codebook_params + self.selector_projection_params


def conv_flops_per_token(h: int, kernel: int, projection: int) -> float:
    """Forward FLOPs of one layer's two convolutions per block token:
      kernel projections  2 x h x 2 K G per convolution (one Linear(h -> 2 K G) on the normalised sublayer input
                          gives both sides' dynamic kernels);
      convolution         per side, one multiply-add per tap and channel, out[t, c] = sum_o (base[o, c] + d[t, o,
                          c // group]) x[t - o, c]: 2 K h per side, two sides per convolution (the kernel sum
                          base + d is elementwise, not a multiply-add, and is not counted, as norms are not)."""
    return 2 * (2.0 * projection + 2 * 2.0 * kernel * h)


def selector_flops_per_slot(h: int, r: int, k: int) -> float:
    """Forward FLOPs of the path selector per scored slot in training, S(a, b) = U(b) + <A[a] * P(h), B[b]> over the
    k candidates b of the slot, predecessor a: hidden projection P(h) 2 h r; A[a] * P(h) r multiplies (a row
    gather of A); k dot products with the successor rows B[b] 2 k r; the unary U(b) added to each, k (the top-k is
    a selection over logits the LM head produced: no multiply-add)."""
    return 2.0 * h * r + r + 2.0 * k * r + k


def selector_serving_flops(h: int, r: int, k: int) -> float:
    """FLOPs of the selector per drafted position as vLLM serves it: P(h) 2 h r, each of the k candidates'
    predecessor rows times P(h) k r, the k x k pair scores 2 k k r, and the unary added to them, k k."""
    return 2.0 * h * r + k * r + 2.0 * k * k * r + k * k


def figures(shapes: Shapes, keys: DFlash2Keys) -> DFlash2Figures:
    h, v, layers = shapes.hidden_size, shapes.vocab_size, shapes.num_layers
    kernel, r, k = keys.conv_kernel_size, keys.selector_rank, keys.selector_top_k
    groups = h // keys.conv_group_size
    projection, base = h * 2 * kernel * groups, 2 * kernel * h
    codebooks = 2 * v * r
    return DFlash2Figures(
        NAME, matrices=layers * 2 * projection + h * r, vectors=layers * 2 * base + codebooks,
        table_params=codebooks, layer_flops_per_token=conv_flops_per_token(h, kernel, projection),
        slot_flops=selector_flops_per_slot(h, r, k), serving_slot_flops=selector_serving_flops(h, r, k),
        activation_per_token_layer=2 * (2 * h + 2 * kernel * groups), activation_per_slot=(2 + k) * r + k,
        table_row_elements_per_slot=2 * k * r, calls_per_slot=1,
        param_inputs={"conv_params": layers * 2 * (projection + base), "codebook_params": codebooks,
                      "selector_projection_params": h * r},
        flop_inputs={"conv_flops_per_token_layer": conv_flops_per_token(h, kernel, projection),
                     "selector_flops_per_slot": selector_flops_per_slot(h, r, k)},
        conv_groups=groups, conv_projection_params=projection, conv_base_params=base,
        conv_params=layers * 2 * (projection + base), codebook_params=codebooks, selector_projection_params=h * r)


def checks(keys: DFlash2Keys, shapes: Shapes, precision: str) -> Iterator[Issue]:
    """What its modules need of the target's shapes and of the block, and FP8's sizes (module doc)."""
    h, vocab, block = shapes.hidden_size, shapes.vocab_size, shapes.block_size
    if h % keys.conv_group_size:
        fits = [g for g in (8, 16, 32, 64) if h % g == 0]
        yield Issue("error", "dflash2_group_size", "drafter.conv_group_size",
                    f"conv_group_size {keys.conv_group_size} does not divide the hidden size {h}: the convolution's "
                    "channel groups share one dynamic kernel value each (the drafter and vLLM refuse it)",
                    f"set drafter.conv_group_size to a divisor of {h}" + (f" (e.g. {fits[-1]})" if fits else ""))
    if keys.selector_top_k > vocab:
        yield Issue("error", "dflash2_top_k", "drafter.selector_top_k",
                    f"selector_top_k {keys.selector_top_k} exceeds the vocabulary ({vocab}): the selector chooses "
                    "among the top-k of the unary logits",
                    "set drafter.selector_top_k to at most the vocabulary size (published: 16)")
    if keys.conv_kernel_size >= block:
        yield Issue("warning", "dflash2_kernel_block", "drafter.conv_kernel_size",
                    f"conv_kernel_size {keys.conv_kernel_size} reaches past the block of {block}: a tap never "
                    f"crosses the block start, so taps {block} and beyond only ever read zeros",
                    "set drafter.conv_kernel_size below drafter.block_size (published: 2)")
    if precision == "fp8":
        yield from _fp8_sized(keys, h)


def _fp8_sized(keys: DFlash2Keys, h: int) -> Iterator[Issue]:
    widths = {"drafter.conv_group_size": 2 * keys.conv_kernel_size * (h // keys.conv_group_size),
              "drafter.selector_rank": keys.selector_rank}
    for key, width in widths.items():
        if width % FP8_ALIGN or h % FP8_ALIGN:
            what = "kernel projections' output" if key == "drafter.conv_group_size" else "hidden projection's output"
            yield Issue("warning", "dflash2_fp8_bf16", key,
                        f"the DFlash2 {what} width {width} (or the hidden size {h}) is not a multiple of {FP8_ALIGN}: "
                        "with drafter.precision fp8 those linears stay in bf16 (torchao float8 needs multiples of 16)",
                        f"choose {key} so the width is a multiple of {FP8_ALIGN}, or accept bf16 for them")


# vLLM: PR #52816 ("[Spec Decode] DFlash2: local convolution + candidate selector", merged 2026-08-21) is listed in
# the v0.28.0 release notes; vLLM 0.32.0's source refuses a DFlash2DraftModel draft on the V1 model runner and its
# V2 runner needs Triton. SGLang: PR #35371 merged 2026-08-19 as c14312a6, after the v0.5.18 release branch was cut;
# v0.5.19 is the first release after it; SGLang 0.5.23's wheel registers `DFlash2DraftModel`, read for the rules.
ENGINES = (
    EngineSupport("sglang", NAME, "0.5.19", "0.5.23",
                  "sgl-project/sglang PR #35371, merged 2026-08-19 (c14312a6) after the v0.5.18 release branch; "
                  "v0.5.19 is the first release after it"),
    EngineSupport("vllm", NAME, "0.28.0", "0.32.0",
                  "vllm-project/vllm PR #52816, listed in the v0.28.0 release notes",
                  requires="the V2 model runner (VLLM_USE_V2_MODEL_RUNNER=1), which needs Triton, i.e. a GPU: "
                           "vLLM 0.32.0 refuses DFlash2 on the V1 runner",
                  env={"VLLM_USE_V2_MODEL_RUNNER": "1"},
                  gpu_only="vLLM serves DFlash2 only on its V2 model runner, which needs Triton (a GPU); its CPU build "
                           "refuses it (\"Model Runner V1 does not support: DFlash candidate-head drafts\")"),
)

SPEC = ArchitectureSpec(
    name=NAME, hf_name="DFlash2DraftModel",
    summary="DFlash2, the same backbone with a grouped dynamic causal convolution around each sublayer and a "
            "pairwise path selector over the top-k drafted tokens (the drafter SGLang and vLLM serve as "
            "DFlash2DraftModel)",
    keys=DFlash2Keys, figures=figures, published=PUBLISHED, published_block=PUBLISHED_BLOCK,
    torch="dflashx.dflash.dflash2", export="dflashx.export.dflash2", engines=ENGINES, checks=checks,
    causal_sliding=False, keys_in_config=True)
