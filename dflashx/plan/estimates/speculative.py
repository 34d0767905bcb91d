"""Speculative decoding in the serving model: what a draft-verify cycle costs and yields (pure).

Any draft method is a `Drafter`: `forwards` sequential draft forwards per cycle of `tokens` tokens per
sequence (the target's MTP head: num_steps forwards of one token; a DFlash drafter: one forward of the
block), then one target forward verifying `verify_tokens` tokens per sequence. Per replica of batch b:
  verify  = the target step (decode.py) over verify_tokens tokens per sequence; with linear-attention
            layers each sequence's state is read once and written per verified token (SGLang keeps one
            state per draft token to roll back to) and once more when the accepted one is kept, and on SGLang's
            GPUs their scan runs over the verified tokens beyond one per sequence at the prefill's measured rate
            (prefill.py `scan_seconds`)
  draft   = forwards x (the draft's weight GEMMs (16-bit weights + LM head read once, its FLOPs at the GEMM
            efficiency of b x tokens rows) + its attention over b x its KV at the context, each at its own
            roofline, routed experts aside) + the engine overhead at the same decode share as the target's; an
            MoE MTP layer's routed experts are `moe.moe_layer` at the batch's draft tokens
  DFlash2   the DFlash forward plus, per block token, each layer's two convolutions (resolve.flops,
            `dflash2_layer_flops_per_token`) and, per drafted position, the path selector as vLLM
            serves it (PR #52816, `qwen3_dflash2.py` `_score_edges`: the whole k x k lattice of
            edges between adjacent positions' top-k candidates, before the walk): the hidden
            projection 2 h r, A[p] * P(h) for the k predecessors k r, the k x k pair scores 2 k^2 r
            and the unary k^2. Its weights are read once per forward except the two V x r codebooks,
            of which each drafted position reads 2 k rows (its k candidates' successor rows and the
            previous position's k predecessor rows), at most the codebooks themselves per forward
  tau     = 1 + sum of the acceptance shares of the drafted positions (resolve.speculative)
  tokens/s per replica = O / (O x (verify + draft) / (b x tau) + prefill), prefill with the draft's own
            pass over the prompt, against O / (O x step / b + prefill) without it.
Speculation pays at a batch when the first is larger; the plan says which at its batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from dflashx.plan.estimates.decode import (
    Roofline, Step, allreduce_seconds, gemm, gemm_efficiency, head_bytes, moe_forward, overhead_seconds, part,
    sixteen_bit, target_step,
)
from dflashx.plan.estimates.device import Device
from dflashx.plan.estimates.engine import EngineRow
from dflashx.plan.estimates.prefill import DraftPass, Prefill, mtp_prompt_pass, prefill, scan_seconds
from dflashx.plan.estimates.serving import Batch, SpecMemory, drafter_on, mtp_on
from dflashx.config.architectures import architecture
from dflashx.plan.expr import Expr, named, var
from dflashx.resolve.flops import DrafterDims
from dflashx.resolve.model import ResolvedRecipe
from dflashx.resolve.serving import kv_elem_bytes
from dflashx.resolve.speculative import accepted_length


# A launch-bound engine's layer calls of a draft forward beyond the draft's own layers: the LM head for an
# MTP head; for a DFlash drafter the embedding with its norm and the LM head of the block forward, plus the
# context projection of the accepted features (`fc` and k/v, `DFlashDrafter.extend_context`, its own pass).
# DFlash2: the same three, plus the selector (`Drafter.extra_calls`: the in-process walk scores one drafted
# position per call, `dflash.dflash2.PathSelector.walk`). EAGLE / EAGLE-3 (`drafters.py`): `fc` and the LM head.
# A DFlash-family drafter's are its architecture's (`ArchitectureSpec.draft_calls`, `Drafter.method_calls`).
DRAFT_EXTRA_CALLS = {"mtp": 1, "eagle": 2, "eagle3": 2}


@dataclass(frozen=True)
class Drafter:
    """One draft method's work per cycle (module doc); FLOPs and bytes per sequence unless said."""

    method: str
    forwards: int
    tokens: int
    layers: int
    weight_bytes: float  # read once per forward (16-bit), LM head included
    flops_per_token: float  # dense FLOPs per drafted token and forward
    attention_flops_per_context: float  # attention FLOPs per drafted token per context token
    kv_bytes_per_context: float  # the draft's own KV read per context token and forward
    context_cap: float | None  # a sliding window bounds the draft's context
    cycle_flops: float  # per sequence and cycle, outside the forwards (projecting accepted context)
    prompt: DraftPass  # the draft's own pass over the prompt (prefill.py)
    verify_tokens: int
    drafts: int
    memory: SpecMemory
    moe_layers: int = 0  # draft layers with routed experts: their touched experts are read per forward
    row_bytes: float = 0.0  # table rows read per sequence and forward (DFlash2's codebooks)
    table_bytes: float = 0.0  # the tables those rows come from: a forward reads at most all of them
    extra_calls: int = 0  # launch-bound layer calls beyond the method's (DFlash2's walk)
    method_calls: int | None = None  # the method's layer calls beyond its layers; None: DRAFT_EXTRA_CALLS's

    @property
    def calls(self) -> int:
        """The method's launch-bound layer calls per forward beyond its layers."""
        return DRAFT_EXTRA_CALLS[self.method] if self.method_calls is None else self.method_calls


def mtp_drafter(recipe: ResolvedRecipe) -> Drafter:
    """The target's MTP head as SGLang runs it (EAGLE worker): num_steps forwards of the MTP layers
    (one full-attention decoder layer, with the target's MoE feed-forward when it has one, + `fc` over
    [embedding, hidden], 2 h^2) and the shared LM head. Weights read and FLOPs per drafted token leave the
    routed experts to `draft_step` (`moe.py`); the prompt pass is `prefill.mtp_prompt_pass`."""
    facts, spec = recipe.target.facts, recipe.stages.generate.serving.speculative
    prompt = mtp_prompt_pass(facts)
    dense = prompt.gemm_flops_per_token / 2  # the MTP layers' parameters multiplied per token, routed experts aside
    head = facts.vocab_size * facts.hidden_size
    width = facts.num_attention_heads * facts.head_dim
    kv = kv_elem_bytes(recipe.stages.generate.serving.kv_cache_dtype, recipe.stages.generate.serving.weight_dtype)
    kv_per_token = 2 * facts.mtp_layers * facts.num_kv_heads * facts.head_dim * kv
    return Drafter("mtp", spec.num_steps, spec.eagle_topk, facts.mtp_layers,
                   dense * 2 + head_bytes(facts, "bf16"), 2.0 * (dense + head),
                   4.0 * width * facts.mtp_layers, kv_per_token, None, 0.0, prompt,
                   spec.num_draft_tokens, spec.num_steps, SpecMemory(0.0, kv_per_token, spec.num_draft_tokens),
                   prompt.moe_layers)


def dflash_drafter(recipe: ResolvedRecipe, dims: DrafterDims, block_size: int, window: int | None,
                   tau: float) -> Drafter:
    """A DFlash (or DFlash2) drafter as SGLang's DFLASH serves it: one forward of the block (anchor + B-1
    masks) through its layers, the LM head on the B-1 drafted slots, and `fc` + k/v projections of the
    tau accepted tokens per cycle (the context features); DFlash2's convolutions on the block and its
    selector on the drafted slots (module doc). Weights and KV in 16 bits."""
    width = dims.num_attention_heads * dims.head_dim
    head = dims.hidden_size * dims.vocab_size
    dense = dims.num_layers * dims.layer_params
    kv_per_token = dims.num_layers * 2 * dims.num_key_value_heads * dims.head_dim * 2
    context = 2.0 * (dims.fc_params + dims.num_layers * dims.kv_params)
    modules = dims.modules  # the architecture's own (DFlash2: convolutions on the block, selector per drafted slot)
    per_token = (2.0 * dense + 2.0 * head * (block_size - 1) / block_size
                 + dims.num_layers * modules.layer_flops_per_token
                 + modules.serving_slot_flops * (block_size - 1) / block_size)
    rows = (block_size - 1) * modules.table_row_elements_per_slot * 2
    return Drafter(modules.architecture, 1, block_size, dims.num_layers,
                   (dims.trainable - modules.table_params + head) * 2, per_token, 4.0 * width * dims.num_layers,
                   kv_per_token, window, context * tau, DraftPass(context), block_size, block_size - 1,
                   SpecMemory(dims.trainable * 2, kv_per_token, block_size), row_bytes=rows,
                   table_bytes=modules.table_params * 2, extra_calls=(block_size - 1) * modules.calls_per_slot,
                   method_calls=architecture(modules.architecture).draft_calls)


def drafter_window(recipe: ResolvedRecipe) -> int | None:
    """The drafter's context bound: its sliding window when every layer slides, else none."""
    d = recipe.drafter
    return d.sliding_window if d.layer_types and all(t == "sliding_attention" for t in d.layer_types) else None


@dataclass(frozen=True)
class GenerationDraft:
    """What the generation servers draft with: the draft, its acceptance profile and where that comes from."""

    name: str  # "the MTP head" or "the DFlash drafter"
    drafter: Drafter
    acceptance: tuple[float | None, ...]
    acceptance_source: str


def generation_draft(recipe: ResolvedRecipe) -> GenerationDraft | None:
    """The target's MTP head when the servers run it (`serving.mtp_on`), a DFlash drafter folder
    (`stages.generate.serving.drafter`, trained with this recipe's drafter: its dims, block and window) with the
    acceptance `speculative.acceptance` gives, else the expected drafter acceptance (`deploy`), or None."""
    spec = recipe.stages.generate.serving.speculative
    acceptance = tuple(spec.acceptance)
    if mtp_on(recipe):
        return GenerationDraft("the MTP head", mtp_drafter(recipe), acceptance, spec.acceptance_source)
    if not drafter_on(recipe):
        return None
    d = recipe.drafter
    drafter = dflash_drafter(recipe, d.dims, d.block_size, drafter_window(recipe),
                             accepted_length(acceptance, d.block_size - 1))
    return GenerationDraft("the DFlash drafter", drafter, acceptance, spec.acceptance_source)


def draft_step(recipe: ResolvedRecipe, dev: Device, b: Batch, row: EngineRow, d: Drafter) -> Step:
    """One draft forward for the batch, in 16 bits, as two kinds of kernel (decode.py): its weight GEMMs (weights
    and table rows read, FLOPs at the GEMM efficiency of its tokens) and its attention over its own KV; with the
    engine overhead of its decode share."""
    batch = max(b.value, 1)
    context = min(b.mean_context, d.context_cap) if d.context_cap else b.mean_context
    dtype = sixteen_bit(recipe.stages.generate.serving.weight_dtype)
    rows = batch * d.tokens
    weights = part(recipe, dev, "weights", d.weight_bytes + min(batch * d.row_bytes, d.table_bytes),
                   batch * (d.tokens * d.flops_per_token + d.cycle_flops / d.forwards), dtype,
                   gemm_efficiency(recipe, rows))
    attention = part(recipe, dev, "attention", batch * d.kv_bytes_per_context * context,
                     rows * d.attention_flops_per_context * context, dtype)
    r = Roofline((weights, attention), dev.peak_flops(dtype), gemm(recipe, dtype), gemm_efficiency(recipe, rows))
    share = d.layers / recipe.target.facts.num_layers
    moe = moe_forward(recipe, dev, row, rows, dtype, graphed=True) if d.moe_layers else None
    return Step(r, overhead_seconds(r, row, d.layers + d.calls + d.extra_calls),
                allreduce_seconds(recipe, rows) * share, moe, d.moe_layers)


@dataclass(frozen=True)
class Rate:
    """Tokens/s of one replica at a batch (`throughput`: the expression that computes it, for --explain), and how
    the time of a generated token splits."""

    throughput: Expr
    step_seconds: float  # a decode step, or a whole draft-verify cycle
    tau: float  # tokens per step per sequence (1 without speculation)
    prefill: Prefill
    prefill_allreduce_s: float
    verify: Step | None = None
    draft: Step | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.throughput.value

    @property
    def prefill_seconds(self) -> float:
        return self.prefill.seconds + self.prefill_allreduce_s

    @property
    def per_token_seconds(self) -> float:
        return self.step_seconds / self.tau


def replica_rate(recipe: ResolvedRecipe, dev: Device, b: Batch, row: EngineRow, output: float, prompt: float,
                 drafter: Drafter | None = None, acceptance: Sequence[float | None] = ()) -> Rate:
    """Output tokens/s of one replica decoding batch `b` (module doc); `drafter` None: no speculation."""
    batch, dtype = max(b.value, 1), recipe.stages.generate.serving.weight_dtype
    fixed = row.call_latency.value * (recipe.target.facts.num_layers + 1) if row.call_latency else 0.0
    first = prefill(recipe, dev, prompt, dtype, row, drafter.prompt if drafter else DraftPass(), fixed)
    reduce = allreduce_seconds(recipe, prompt)
    pre, out = var("prefill_s", first.seconds + reduce), var("output_mean", max(output, 1e-9))
    if drafter is None:
        step = target_step(recipe, dev, b, row)
        return Rate(out / (out * var("step_s", step.seconds) / var("batch", batch) + pre), step.seconds, 1.0, first,
                    reduce)
    passes = 2.0 + drafter.verify_tokens if recipe.target.facts.recurrent_state_bytes else 2.0
    verify = target_step(recipe, dev, b, row, drafter.verify_tokens, passes)
    if row.engine == "sglang" and recipe.hardware.gpu is not None:  # the prefill's mixer term applies (prefill.py)
        extra = batch * (drafter.verify_tokens - 1)
        verify = replace(verify, mixer_s=scan_seconds(recipe.target.facts, dev, recipe.stages.generate.serving.tp,
                                                      extra))
    draft = draft_step(recipe, dev, b, row, drafter)
    cycle = named("cycle_s", var("verify_s", verify.seconds) + var("draft_forwards", drafter.forwards)
                  * var("draft_s", draft.seconds))
    tau = accepted_length(acceptance, drafter.drafts)
    return Rate(out / (out * cycle / (var("batch", batch) * var("tau", tau)) + pre), cycle.value, tau, first, reduce,
                verify, draft)


def pays(spec: Rate, plain: Rate) -> bool:
    return spec.tokens_per_second > plain.tokens_per_second and not math.isclose(
        spec.tokens_per_second, plain.tokens_per_second)
