"""Rules about DFlash2's keys (`drafter.architecture: dflash2`): what its modules need of the target's
shapes and of the block, and DFlash2 keys a DFlash drafter would ignore.

Sources: the modules (`dflash.dflash2`, the reference's and vLLM PR #52816's `qwen3_dflash2.py`, which
both raise when `conv_group_size` does not divide `hidden_size`); the selector takes the top-k of the
V unary logits (vLLM `compute_candidates`), so k cannot exceed V; the FP8 filter of
`dflash.kernels._fp8_sized` (torchao float8 only for linears whose both sizes are multiples of 16).
No rule on `selector_rank`: vLLM's scores are a plain einsum over any rank (`_score_edges`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from dflashx.config.drafter import DFLASH2_KEYS, DrafterSpec
from dflashx.plan.context import PlanContext
from dflashx.plan.findings import Finding, error, warning

Rule = Callable[[PlanContext], Iterable[Finding]]

FP8_ALIGN = 16  # torchao float8 matmuls: both sizes of a linear a multiple of 16 (dflash/kernels.py FP8_ALIGN)


def dflash2_keys_used(ctx: PlanContext) -> Iterable[Finding]:
    """DFlash2 keys changed from their published defaults on a DFlash drafter: it has no such modules."""
    d = ctx.recipe.drafter
    if d.architecture == "dflash2":
        return
    changed = [k for k in DFLASH2_KEYS if getattr(d, k) != DrafterSpec.model_fields[k].default]
    if changed:
        yield warning("dflash2_keys_unused", f"drafter.{changed[0]}",
                      f"drafter.{', drafter.'.join(changed)} set, but drafter.architecture is dflash, which has "
                      "no convolutions or selector: the keys change nothing",
                      "set drafter.architecture: dflash2, or drop the DFlash2 keys")


def dflash2_fits_target(ctx: PlanContext) -> Iterable[Finding]:
    d, h, vocab = ctx.recipe.drafter, ctx.facts.hidden_size, ctx.facts.vocab_size
    if d.architecture != "dflash2":
        return
    if h % d.conv_group_size:
        fits = [g for g in (8, 16, 32, 64) if h % g == 0]
        yield error("dflash2_group_size", "drafter.conv_group_size",
                    f"conv_group_size {d.conv_group_size} does not divide the hidden size {h}: the convolution's "
                    "channel groups share one dynamic kernel value each (the drafter and vLLM refuse it)",
                    f"set drafter.conv_group_size to a divisor of {h}" + (f" (e.g. {fits[-1]})" if fits else ""))
    if d.selector_top_k > vocab:
        yield error("dflash2_top_k", "drafter.selector_top_k",
                    f"selector_top_k {d.selector_top_k} exceeds the vocabulary ({vocab}): the selector chooses "
                    "among the top-k of the unary logits",
                    "set drafter.selector_top_k to at most the vocabulary size (published: 16)")
    if d.conv_kernel_size >= d.block_size:
        yield warning("dflash2_kernel_block", "drafter.conv_kernel_size",
                      f"conv_kernel_size {d.conv_kernel_size} reaches past the block of {d.block_size}: a tap never "
                      f"crosses the block start, so taps {d.block_size} and beyond only ever read zeros",
                      "set drafter.conv_kernel_size below drafter.block_size (published: 2)")


def dflash2_fp8_sized(ctx: PlanContext) -> Iterable[Finding]:
    d, dims = ctx.recipe.drafter, ctx.recipe.drafter.dims
    if d.architecture != "dflash2" or d.precision != "fp8":
        return
    widths = {"drafter.conv_group_size": 2 * d.conv_kernel_size * dims.conv_groups,
              "drafter.selector_rank": d.selector_rank}
    odd = {key: w for key, w in widths.items() if w % FP8_ALIGN or dims.hidden_size % FP8_ALIGN}
    for key, width in odd.items():
        what = "kernel projections' output" if key == "drafter.conv_group_size" else "hidden projection's output"
        yield warning("dflash2_fp8_bf16", key,
                      f"the DFlash2 {what} width {width} (or the hidden size {dims.hidden_size}) is not a multiple "
                      f"of {FP8_ALIGN}: with drafter.precision fp8 those linears stay in bf16 (torchao float8 "
                      "needs multiples of 16)",
                      f"choose {key} so the width is a multiple of {FP8_ALIGN}, or accept bf16 for them")


DRAFTER_RULES: tuple[Rule, ...] = (dflash2_keys_used, dflash2_fits_target, dflash2_fp8_sized)
