"""Generation time: a roofline of batched decode, times the profile's serving efficiency.

Per decode step of one server (a TP group) holding `batch` running sequences:
  bytes = weights + batch x (KV bytes/token x mean context + 2 x recurrent state)   (state read + written)
  flops = batch x (2 x matmul params + 4 x mean context x heads x head_dim x attention layers)
  step  = max(bytes / (bandwidth x tp), flops / (peak x tp))
tokens/s = replicas x batch / step x efficiency. Prefill adds prompt-token FLOPs at the same
efficiency. `batch` is what the KV/state pool holds, capped by the concurrency settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.config.schema import Recipe
from dflashx.config.fields import PRECISION_BYTES as BYTES
from dflashx.plan.estimates.device import KV_BYTES, activation_bytes, CALIBRATED_SERVING, device_of, factor
from dflashx.plan.estimates.tokens import Tokens
from dflashx.plan.explain import Term, term
from dflashx.targets.registry import TargetFacts


@dataclass(frozen=True)
class Serving:
    """How the target is served on the profile."""

    tp: int
    dp: int
    weight_dtype: str
    kv_elem_bytes: float
    weight_bytes: float  # whole model, one replica
    pool_bytes: float | None  # KV + state pool of one replica; None on the CPU
    per_seq_bytes: float
    batch: int
    efficiency: float
    calibrated: bool


@dataclass(frozen=True)
class Generation:
    serving: Serving
    tokens_per_second: float
    seconds: float
    terms: tuple[Term, ...]


def matmul_params(facts: TargetFacts) -> int:
    """Parameters multiplied per token: every layer plus the LM head (embedding lookup is free)."""
    return facts.params_through_layer(facts.num_layers - 1) + facts.vocab_size * facts.hidden_size


def flops_per_token(facts: TargetFacts, context: float) -> float:
    attention = 4 * context * facts.num_attention_heads * facts.head_dim * facts.num_kv_layers
    return 2 * matmul_params(facts) + attention


def serving_setup(recipe: Recipe, facts: TargetFacts, tokens: Tokens) -> Serving:
    hw, gen = recipe.hardware, recipe.stages.generate
    dev = device_of(hw)
    if hw.gpu is None:
        tp, dp, weight_dtype = 1, 1, recipe.target.precision
    else:
        tp, dp, weight_dtype = hw.serving.tp, hw.serving.dp, hw.serving.weight_dtype
    kv = KV_BYTES.get(hw.serving.kv_cache_dtype, activation_bytes(weight_dtype))  # auto: the compute dtype
    weights = facts.total_params * BYTES[weight_dtype]
    context = tokens.prompt_mean + tokens.output_mean / 2
    per_seq = facts.kv_bytes_per_token(kv) * context + facts.recurrent_state_bytes
    if gen.backend == "transformers":
        cap = gen.batch_size
    else:
        cap = min(gen.concurrency, hw.serving.max_running_requests)
    pool = None
    if dev.memory_bytes is not None:
        pool = dev.memory_bytes * hw.serving.mem_fraction_static * tp - weights
        cap = min(cap, max(int(pool // per_seq), 0))
    efficiency, calibrated = factor(hw, CALIBRATED_SERVING, hw.serving.efficiency)
    return Serving(tp, dp, weight_dtype, kv, weights, pool, per_seq, max(cap, 0), efficiency, calibrated)


def estimate_generation(recipe: Recipe, facts: TargetFacts, tokens: Tokens) -> Generation:
    hw = recipe.hardware
    dev = device_of(hw)
    s = serving_setup(recipe, facts, tokens)
    batch = max(s.batch, 1)
    context = tokens.prompt_mean + tokens.output_mean / 2
    peak = dev.peak_flops(s.weight_dtype)
    step_bytes = s.weight_bytes + batch * (
        facts.kv_bytes_per_token(s.kv_elem_bytes) * context + 2 * facts.recurrent_state_bytes
    )
    step_flops = batch * flops_per_token(facts, context)
    t_mem = step_bytes / (dev.bandwidth_bps * s.tp)
    t_compute = step_flops / (peak * s.tp)
    step = max(t_mem, t_compute)
    tps = s.dp * batch / step * s.efficiency
    prefill = tokens.prompt * flops_per_token(facts, tokens.prompt_mean / 2) / (peak * s.tp * s.dp * s.efficiency)
    seconds = (tokens.output / tps if tokens.output else 0.0) + prefill
    eff_note = "calibrated (hardware.calibrated.serving_efficiency)" if s.calibrated else "profile default"
    terms = (
        term("generate.batch", batch, "sequences/server",
             "min(concurrency caps, floor(pool / (KV bytes/token x mean context + recurrent state)))",
             pool_bytes=s.pool_bytes, per_seq_bytes=s.per_seq_bytes, mean_context=context,
             kv_bytes_per_token=facts.kv_bytes_per_token(s.kv_elem_bytes),
             recurrent_state_bytes=facts.recurrent_state_bytes),
        term("generate.step_bytes", step_bytes, "bytes",
             "weights + batch x (KV bytes/token x mean context + 2 x recurrent state)",
             weight_bytes=s.weight_bytes, batch=batch),
        term("generate.step_seconds", step, "s",
             "max(step bytes / (bandwidth x tp), step FLOPs / (peak x tp))",
             memory_s=t_mem, compute_s=t_compute, bound="memory" if t_mem >= t_compute else "compute",
             bandwidth_bps=dev.bandwidth_bps, peak_flops=peak, tp=s.tp),
        term("generate.tokens_per_second", tps, "tokens/s", "dp x batch / step x efficiency",
             dp=s.dp, efficiency=s.efficiency, efficiency_source=eff_note,
             source_note="efficiency fitted to the seeds' measured throughput (docs/hardware.md)"),
        term("generate.seconds", seconds, "s",
             "output tokens / tokens_per_second + prefill FLOPs / (peak x gpus x efficiency)",
             output_tokens=tokens.output, prefill_s=prefill,
             mtp="not modelled (MTP only speeds decode up; the estimate stays conservative)"),
    )
    return Generation(s, tps, seconds, terms)
