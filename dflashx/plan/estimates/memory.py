"""Peak device memory per stage (per GPU).

Training: the drafter's model states (`model_states.py`: what DeepSpeed allocates per parameter
for the resolved precision, `master_weights`, optimizer and ZeRO stage, partitioned over the
data-parallel ranks), the online target's weights, and activations after Korthikanti et al. 2022
(34 x hidden bytes per token per layer with flash attention), plus the drafter logits in fp32 and
the captured target hidden states.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.config.fields import PRECISION_BYTES as BYTES
from dflashx.plan.estimates.activations import longest_sample, peak_sequence_activations
from dflashx.plan.estimates.device import activation_bytes
from dflashx.plan.estimates.generation import Serving
from dflashx.plan.estimates.model_states import state_bytes, zero_model_state_bytes
from dflashx.plan.estimates.serving import mtp_memory
from dflashx.plan.estimates.tokens import Tokens
from dflashx.plan.estimates.training import Training
from dflashx.plan.explain import Term, term
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


def training_memory(recipe: ResolvedRecipe, tr: Training) -> StageMemory:
    facts, d = recipe.target.facts, recipe.stages.train
    online = recipe.stages.train.mode == "online"
    target = facts.total_params * BYTES[recipe.target.precision] if online else 0.0
    per_param = state_bytes(d.precision, d.master_weights, d.optimizer, d.zero_stage)
    states = zero_model_state_bytes(tr.drafter.trainable, d.zero_stage, d.world_size, per_param)
    longest = peak_sequence_activations(recipe)
    activations = d.micro_batch * longest.total
    parts = {"target_weights": target, "drafter_model_states": states, "activations": activations}
    total = sum(parts.values())
    formula = (f"target weights (online) + ZeRO-{d.zero_stage} model states of {tr.drafter.trainable} drafter "
               f"params at {per_param.total:g} bytes each ({d.precision} weights, {d.master_weights} master, "
               f"{d.optimizer}) over {d.world_size} ranks + micro_batch x activations of the longest sample (34 h "
               "bytes/token/layer x drafter tokens x layers + fp32 logits + captured states)")
    return StageMemory(total, parts, term("train.peak_memory", total, "bytes", formula,
                                          micro_batch=d.micro_batch, longest_sample=longest.length,
                                          longest_drafter_tokens=longest.drafter_tokens, **parts))


def eval_context(recipe: ResolvedRecipe) -> int:
    """Tokens of the longest sequence evaluation decodes: a prompt as long as the longest training
    sample (`activations.longest_sample`: tokenize keeps nothing longer, so neither are the held-out
    prompts of the same data; a suite with longer prompts exceeds it) plus `stages.eval.max_new_tokens`."""
    return longest_sample(recipe) + recipe.stages.eval.max_new_tokens


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
    total = sum(parts.values())
    return StageMemory(total, parts, term("eval.peak_memory", total, "bytes",
                                          "target + drafter weights + KV/state of one sequence of the longest "
                                          "training sample + max_new_tokens", context_tokens=context, **parts))
