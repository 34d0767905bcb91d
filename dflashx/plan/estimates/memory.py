"""Peak device memory per stage (per GPU).

Training: the terms of `dflashx.resolve.memory` (the drafter's model states as DeepSpeed allocates
them for the resolved precision, `master_weights`, optimizer and ZeRO stage; activations at the
longest sample the run can see; the target's weights whole or ZeRO-3 sharded with its gather
working set); serving: SGLang's preallocation or weights + batch; eval: one speculative decode at
its real context.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.config.fields import PRECISION_BYTES as BYTES
from dflashx.plan.estimates.generation import Serving
from dflashx.plan.estimates.serving import spec_memory
from dflashx.plan.estimates.tokens import Tokens
from dflashx.plan.estimates.training import Training
from dflashx.plan.explain import Term, explained
from dflashx.plan.expr import Expr, total, var
from dflashx.resolve.memory import (
    SequenceActivations, activation_bytes, longest_sample, sequence_activations, train_memory_parts,
)
from dflashx.resolve.model_states import state_bytes
from dflashx.resolve.model import ResolvedRecipe
from dflashx.targets.registry import TargetFacts


@dataclass(frozen=True)
class StageMemory:
    bytes: float
    parts: dict[str, float]
    term: Term


def serving_memory(recipe: ResolvedRecipe, facts: TargetFacts, tokens: Tokens, s: Serving) -> StageMemory:
    """Per GPU: SGLang preallocates mem_fraction_static; transformers holds weights + its batch."""
    weights = s.weight_bytes / s.tp
    max_ctx = tokens.prompt_mean + recipe.stages.generate.max_tokens
    one_seq = facts.kv_bytes_per_token(s.kv_elem_bytes) * max_ctx + facts.recurrent_state_bytes
    spec = spec_memory(recipe)  # the draft's weights and KV, and one state per verified token
    if spec is not None:
        one_seq += spec.kv_bytes_per_token * max_ctx + spec.verify_tokens * facts.recurrent_state_bytes
    # a decode step's working set: a few hidden-size buffers per running sequence
    activations = 4 * facts.hidden_size * max(s.batch, 1) * activation_bytes(s.weight_dtype)
    parts = {"weights": weights, "one_full_sequence": one_seq / s.tp, "activations": activations}
    peak: Expr
    if recipe.stages.generate.serving.mode != "in-process" and recipe.hardware.gpu is not None:
        peak = var("gpu_bytes", recipe.hardware.gpu.memory_gb * 1e9) \
            * var("mem_fraction_static", recipe.stages.generate.serving.mem_fraction_static)
        note = "the engine preallocates its weights and KV/state pool"
    else:
        peak = var("weights", weights) + var("batch", max(s.batch, 1)) * var("one_seq", one_seq) / var("tp", s.tp) \
            + var("activations", activations)
        note = "one_seq: KV at max context + recurrent state"
    return StageMemory(peak.value, parts, explained("generate.peak_memory", peak, "bytes", note, **parts))


def training_memory(recipe: ResolvedRecipe, tr: Training) -> StageMemory:
    facts, d = recipe.target.facts, recipe.stages.train
    longest = longest_sample_activations(recipe)
    per_param = state_bytes(d.precision, d.master_weights, d.optimizer, d.zero_stage)
    parts = train_memory_parts(
        facts, tr.drafter, online=d.mode == "online", load_precision=recipe.target.load_precision,
        train_precision=d.precision, master_weights=d.master_weights, optimizer=d.optimizer,
        sharding=d.target_sharding, ranks=d.world_size, zero_stage=d.zero_stage, micro_batch=d.micro_batch,
        sample=longest)
    summed = parts_sum(parts)
    target = ("1/N of the target weights + 2 gathered units + whole embedding/head (ZeRO-3 sharded)"
              if d.target_sharding == "zero3" else "target weights")
    aux = state_bytes(d.precision, d.master_weights, "adamw", d.zero_stage)
    split = (f" ({tr.drafter.adamw_params} of them — norms, base kernels, codebooks — in Muon's auxiliary AdamW at "
             f"{aux.total:g})" if d.optimizer == "muon" else "")
    formula = (f"{target} (online) + ZeRO-{d.zero_stage} model states of {tr.drafter.trainable} drafter "
               f"params at {per_param.total:g} bytes each{split} ({d.precision} weights, {d.master_weights} master, "
               f"{d.optimizer}) over {d.world_size} ranks + micro_batch x activations of the longest sample (34 h "
               "bytes/token/layer x drafter tokens x layers + fp32 logits + captured states)")
    return StageMemory(summed.value, parts, explained(
        "train.peak_memory", summed, "bytes", formula, micro_batch=d.micro_batch, target_sharding=d.target_sharding,
        longest_sample=longest.length, longest_drafter_tokens=longest.drafter_tokens))


def longest_sample_activations(recipe: ResolvedRecipe) -> SequenceActivations:
    """One training sequence's activations at the longest sample the run can see (`resolve.memory`)."""
    train = recipe.stages.train
    length = longest_sample(train.max_length, recipe.stages.tokenize.max_length)
    return sequence_activations(recipe.target.facts, recipe.drafter.dims, recipe.target.load_precision, length,
                                train.anchors_per_seq, recipe.drafter.block_size)


def eval_context(recipe: ResolvedRecipe) -> int:
    """Tokens of the longest sequence evaluation decodes: a prompt as long as the longest training
    sample (`resolve.memory.longest_sample`: tokenize keeps nothing longer, so neither are the held-out
    prompts of the same data; a suite with longer prompts exceeds it) plus `stages.eval.max_new_tokens`."""
    return longest_sample(recipe.stages.train.max_length, recipe.stages.tokenize.max_length) \
        + recipe.stages.eval.max_new_tokens


def eval_memory(recipe: ResolvedRecipe, tr: Training) -> StageMemory:
    """Target + drafter weights and one sequence's KV/state at `eval_context` (batch-1 speculative
    decoding), everything in the precision evaluation loads (`target.load_precision`)."""
    facts, load = recipe.target.facts, recipe.target.load_precision
    context = eval_context(recipe)
    parts = {
        "target_weights": facts.total_params * BYTES[load],
        "drafter_weights": tr.drafter.trainable * BYTES[load],
        "one_sequence": facts.kv_bytes_per_token(activation_bytes(load)) * context + facts.recurrent_state_bytes,
    }
    summed = parts_sum(parts)
    return StageMemory(summed.value, parts, explained(
        "eval.peak_memory", summed, "bytes", "one_sequence: the KV/state of the longest training sample + "
        "max_new_tokens", context_tokens=context))


def parts_sum(parts: dict[str, float]) -> Expr:
    """The peak as the sum of its named parts (`--explain` shows each)."""
    return total(*(var(name, value) for name, value in parts.items()))
