"""Peak device memory per stage (per GPU).

Training: the terms of `dflashx.resolve.memory` (drafter ZeRO model states, activations, the
target's weights whole or ZeRO-3 sharded with its gather working set), over the mean training
sample; serving: SGLang's preallocation or weights + batch; eval: one speculative decode.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.config.fields import PRECISION_BYTES as BYTES
from dflashx.config.schema import Recipe
from dflashx.plan.estimates.generation import Serving
from dflashx.plan.estimates.serving import mtp_memory
from dflashx.plan.estimates.tokens import Tokens
from dflashx.plan.estimates.training import Training
from dflashx.plan.explain import Term, term
from dflashx.resolve.memory import activation_bytes, train_memory_parts
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
    spec = mtp_memory(recipe)  # the MTP head's KV and one state per verified token
    if spec is not None:
        one_seq += spec.kv_bytes_per_token * max_ctx + spec.verify_tokens * facts.recurrent_state_bytes
    # a decode step's working set: a few hidden-size buffers per running sequence
    activations = 4 * facts.hidden_size * max(s.batch, 1) * activation_bytes(s.weight_dtype)
    if recipe.stages.generate.backend == "sglang" and recipe.hardware.gpu is not None:
        gpu_bytes = recipe.hardware.gpu.memory_gb * 1e9
        total = gpu_bytes * recipe.stages.generate.serving.mem_fraction_static
        formula = "gpu memory x mem_fraction_static (SGLang preallocates weights + KV/state pool)"
    else:
        total = weights + max(s.batch, 1) * one_seq / s.tp + activations
        formula = "weights + batch x (KV at max context + recurrent state) + activations"
    parts = {"weights": weights, "one_full_sequence": one_seq / s.tp, "activations": activations}
    return StageMemory(total, parts, term("generate.peak_memory", total, "bytes", formula, **parts))


def training_memory(recipe: ResolvedRecipe, tokens: Tokens, tr: Training) -> StageMemory:
    facts, d = recipe.target.facts, recipe.stages.train
    parts = train_memory_parts(
        facts, tr.drafter, online=d.mode == "online", load_precision=recipe.target.load_precision,
        precision=recipe.target.precision, sharding=d.target_sharding, ranks=d.world_size, zero_stage=d.zero_stage,
        micro_batch=d.micro_batch, length=min(tokens.train_len_mean, d.max_length),
        drafter_tokens=tr.drafter_tokens_per_sample)
    total = sum(parts.values())
    target = ("1/N of the target weights + 2 gathered units (ZeRO-3 sharded)" if d.target_sharding == "zero3"
              else "target weights")
    formula = (f"{target} (online) + ZeRO-{d.zero_stage} model states of {tr.drafter.trainable} drafter "
               f"params over {d.world_size} ranks + micro_batch x (34 h bytes/token/layer x drafter tokens x "
               "layers + fp32 logits + captured states)")
    return StageMemory(total, parts, term("train.peak_memory", total, "bytes", formula, micro_batch=d.micro_batch,
                                          target_sharding=d.target_sharding, **parts))


def eval_memory(recipe: Recipe, facts: TargetFacts, tr: Training) -> StageMemory:
    """Target + drafter weights and one sequence's KV/state (batch-1 speculative decoding)."""
    ctx = recipe.stages.eval.max_new_tokens + 4096
    parts = {
        "target_weights": facts.total_params * BYTES[recipe.target.precision],
        "drafter_weights": tr.drafter.trainable * BYTES[recipe.target.precision],
        "one_sequence": facts.kv_bytes_per_token(2) * ctx + facts.recurrent_state_bytes,
    }
    total = sum(parts.values())
    return StageMemory(total, parts, term("eval.peak_memory", total, "bytes",
                                          "target + drafter weights + KV/state of one sequence", **parts))
