"""Peak device memory per stage (per GPU).

Training uses DeepSpeed's own ZeRO model-state estimates (`estimate_zero2_model_states_mem_needs`,
`estimate_zero3_model_states_mem_needs`, no offload): with bf16 mixed precision every trainable
parameter costs 2 (bf16 weights) + 18 bytes (2 bf16 + 4 fp32 gradients, 4 fp32 master weights,
8 Adam moments), and stage s partitions them over the Nd data-parallel ranks
(Rajbhandari et al. 2020, "ZeRO", sec. 5):
  stage 0: 20 P     stage 1: 4 P + 16 P / Nd     stage 2: 2 P + 18 P / Nd
  stage 3: 4 x largest layer + 18 P / Nd
Activations follow Korthikanti et al. 2022 (34 x hidden bytes per token per layer with flash
attention), plus the drafter logits in fp32 and the captured target hidden states.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.config.fields import PRECISION_BYTES as BYTES
from dflashx.config.schema import Recipe
from dflashx.plan.estimates.device import activation_bytes
from dflashx.plan.estimates.generation import Serving
from dflashx.plan.estimates.serving import mtp_memory
from dflashx.plan.estimates.tokens import Tokens
from dflashx.plan.estimates.training import Training
from dflashx.plan.explain import Term
from dflashx.resolve.model import ResolvedRecipe
from dflashx.targets.registry import TargetFacts


def zero_model_state_bytes(params: float, stage: int, ranks: int, largest_layer: float = 0.0) -> float:
    """DeepSpeed ZeRO model-state bytes per rank for `params` trainable parameters (no offload)."""
    n = max(ranks, 1)
    return {
        0: 20 * params,
        1: 4 * params + 16 * params / n,
        2: 2 * params + 18 * params / n,
        3: 4 * largest_layer + 18 * params / n,
    }[stage]


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
    return StageMemory(total, parts, Term("generate.peak_memory", total, "bytes", formula, parts))


def training_memory(recipe: ResolvedRecipe, tokens: Tokens, tr: Training) -> StageMemory:
    facts, d = recipe.target.facts, recipe.stages.train
    online = recipe.stages.train.mode == "online"
    target = facts.total_params * BYTES[recipe.target.precision] if online else 0.0
    states = zero_model_state_bytes(tr.drafter.trainable, d.zero_stage, d.world_size, tr.drafter.layer_params)
    act_bytes = activation_bytes(recipe.target.precision)
    length = min(tokens.train_len_mean, d.max_length)
    drafter_act = 34 / 2 * act_bytes * facts.hidden_size * tr.drafter_tokens_per_sample * tr.drafter.num_layers
    logits = 4 * facts.vocab_size * tr.drafter_tokens_per_sample
    captured = len(recipe.drafter.target_layer_ids) * length * facts.hidden_size * act_bytes
    activations = d.micro_batch * (drafter_act + logits + captured)
    parts = {"target_weights": target, "drafter_model_states": states, "activations": activations}
    total = sum(parts.values())
    formula = (f"target weights (online) + ZeRO-{d.zero_stage} model states of {tr.drafter.trainable} drafter "
               f"params over {d.world_size} ranks + micro_batch x (34 h bytes/token/layer x drafter tokens x "
               "layers + fp32 logits + captured states)")
    return StageMemory(total, parts, Term("train.peak_memory", total, "bytes", formula,
                                          {"micro_batch": d.micro_batch, **parts}))


def eval_memory(recipe: Recipe, facts: TargetFacts, tr: Training) -> StageMemory:
    """Target + drafter weights and one sequence's KV/state (batch-1 speculative decoding)."""
    ctx = recipe.stages.eval.max_new_tokens + 4096
    parts = {
        "target_weights": facts.total_params * BYTES[recipe.target.precision],
        "drafter_weights": tr.drafter.trainable * BYTES[recipe.target.precision],
        "one_sequence": facts.kv_bytes_per_token(2) * ctx + facts.recurrent_state_bytes,
    }
    total = sum(parts.values())
    return StageMemory(total, parts, Term("eval.peak_memory", total, "bytes",
                                          "target + drafter weights + KV/state of one sequence", parts))
