"""Generation time: SGLang's batched decode and prefill, predicted from facts (no fitted factor).

Per replica (a TP group of `tp` GPUs) decoding `batch` sequences (`serving.running_batch`):
  bytes/step = decoder weights + LM head + batch x (KV bytes/token x mean context + 2 x state)
               (every step reads the weights and each sequence's KV, reads and writes its state)
  FLOPs/step = batch x (2 x matmul parameters + 4 x context x heads x head_dim x attention layers)
  roofline   = max(bytes / (bandwidth x tp x copy share), FLOPs / (peak x tp x GEMM share))
               (both shares measured; GEMM share per precision)
  step       = roofline / engine decode share + TP all-reduce (2 per layer, ring over the
               interconnect: latency + 2 (tp-1)/tp x batch x hidden x 2 bytes / link bandwidth)
  prefill    = prompt FLOPs (`resolve.flops`) / (peak x tp x GEMM share x engine prefill share)
               + its all-reduces
  tokens/s   = dp x Ō / (Ō x step / batch + prefill) x calibration
The shares are engine facts with their sources (`engine.py`); `calibration` is
`hardware.calibrated.serving_ratio` (measured / this model's prediction on the rented node), 1 when
none. `estimate_generation` takes the output-length distribution so that ranges can call it per
scenario.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.plan.estimates.device import CALIBRATED_SERVING, device_of, factor
from dflashx.plan.estimates.engine import (
    ALLREDUCE_LATENCY_NVLINK, ALLREDUCE_LATENCY_PCIE, COPY_BANDWIDTH, NVLINK_CLASS_GBS, engine_row, gemm_share,
)
from dflashx.plan.estimates.lengths import OutputLengths
from dflashx.plan.estimates.serving import Batch, running_batch
from dflashx.plan.estimates.tokens import Tokens
from dflashx.plan.explain import Term, term
from dflashx.config.fields import PRECISION_BYTES
from dflashx.resolve.flops import target_forward_flops
from dflashx.resolve.model import ResolvedRecipe
from dflashx.targets.registry import TargetFacts


@dataclass(frozen=True)
class Serving:
    """How the target is served, as planned."""

    tp: int
    dp: int
    weight_dtype: str
    kv_elem_bytes: int
    weight_bytes: float  # whole model, one replica
    pool_bytes: float | None  # KV + state pool of one replica; None on the CPU
    per_seq_bytes: float  # KV at the mean running context + state, one sequence
    batch: int
    binding: str
    calibration: float
    calibrated: bool


@dataclass(frozen=True)
class Generation:
    serving: Serving
    tokens_per_second: float
    seconds: float
    terms: tuple[Term, ...]


def matmul_params(facts: TargetFacts) -> int:
    """Parameters multiplied per decoded token: every layer plus the LM head (embedding lookup is free)."""
    return facts.params_through_layer(facts.num_layers - 1) + facts.vocab_size * facts.hidden_size


def flops_per_token(facts: TargetFacts, context: float) -> float:
    attention = 4 * context * facts.num_attention_heads * facts.head_dim * facts.num_kv_layers
    return 2 * matmul_params(facts) + attention


def decode_read_bytes(facts: TargetFacts, weight_dtype: str) -> float:
    """Weights one decode step reads: decoder layers at the served dtype, the LM head at 16 bits."""
    head = facts.vocab_size * facts.hidden_size * (4 if weight_dtype == "fp32" else 2)
    return facts.params_through_layer(facts.num_layers - 1) * PRECISION_BYTES[weight_dtype] + head


def allreduce_seconds(recipe: ResolvedRecipe, tokens: float) -> float:
    """2 ring all-reduces per layer of `tokens` x hidden 16-bit activations over the TP group."""
    tp, hw = recipe.stages.generate.serving.tp, recipe.hardware
    if tp <= 1 or hw.interconnect_gbs is None:
        return 0.0
    nvlink = hw.interconnect_gbs >= NVLINK_CLASS_GBS
    latency = (ALLREDUCE_LATENCY_NVLINK if nvlink else ALLREDUCE_LATENCY_PCIE).value
    payload = 2 * (tp - 1) / tp * tokens * recipe.target.facts.hidden_size * 2
    return 2 * recipe.target.facts.num_layers * (latency + payload / (hw.interconnect_gbs * 1e9))


def _serving(recipe: ResolvedRecipe, b: Batch) -> Serving:
    s, facts = recipe.stages.generate.serving, recipe.target.facts
    calibration, calibrated = factor(recipe.hardware, CALIBRATED_SERVING, 1.0)
    per_seq = facts.kv_bytes_per_token(b.kv_elem_bytes) * b.mean_context + facts.recurrent_state_bytes
    tp, dp = (s.tp, s.dp) if recipe.hardware.gpu is not None else (1, 1)
    return Serving(tp, dp, s.weight_dtype, b.kv_elem_bytes, b.weight_bytes, b.pool_bytes, per_seq, b.value,
                   b.binding, calibration, calibrated)


def estimate_generation(recipe: ResolvedRecipe, tokens: Tokens, lengths: OutputLengths) -> Generation:
    facts, dev = recipe.target.facts, device_of(recipe.hardware)
    b = running_batch(recipe, lengths)
    s = _serving(recipe, b)
    row = engine_row(recipe.stages.generate.backend, facts.num_linear_layers > 0)
    batch = max(s.batch, 1)
    peak = dev.peak_flops(s.weight_dtype)
    gemm = gemm_share(s.weight_dtype if recipe.hardware.gpu is not None else "bf16").value
    step_bytes = decode_read_bytes(facts, s.weight_dtype) + batch * (
        facts.kv_bytes_per_token(s.kv_elem_bytes) * b.mean_context + 2 * facts.recurrent_state_bytes)
    step_flops = batch * flops_per_token(facts, b.mean_context)
    t_mem = step_bytes / (dev.bandwidth_bps * s.tp * COPY_BANDWIDTH.value)
    t_compute = step_flops / (peak * s.tp * gemm)
    t_allreduce = allreduce_seconds(recipe, batch)
    step = max(t_mem, t_compute) / row.decode.value + t_allreduce
    prompt = tokens.prompt_mean
    prefill = (target_forward_flops(facts, facts.num_layers - 1, [prompt]) / (peak * s.tp * gemm * row.prefill.value)
               + allreduce_seconds(recipe, prompt))
    out = max(tokens.output_mean, 1e-9)
    per_replica = out / (out * step / batch + prefill)
    tps = s.dp * per_replica * s.calibration
    seconds = tokens.output / tps if tokens.output else 0.0
    terms = (
        term("generate.batch", batch, "sequences/replica",
             "min(client in-flight, max_running_requests, state slots / 5, KV tokens / mean context)",
             binding=b.binding, caps=b.caps, pool_bytes=b.pool_bytes, mean_context=b.mean_context,
             kv_bytes_per_token=facts.kv_bytes_per_token(s.kv_elem_bytes),
             recurrent_state_bytes=facts.recurrent_state_bytes,
             source="SGLang 0.5.23 mem_cache/kv_cache_configurator.py (docs/planner.md)"),
        term("generate.step_bytes", step_bytes, "bytes",
             "decoder weights + LM head + batch x (KV bytes/token x mean context + 2 x state)",
             weight_bytes=s.weight_bytes, batch=batch),
        term("generate.step_seconds", step, "s",
             "max(bytes / (bandwidth x tp x copy share), FLOPs / (peak x tp x GEMM share)) / decode share "
             "+ TP all-reduce",
             memory_s=t_mem, compute_s=t_compute, allreduce_s=t_allreduce,
             bound="memory" if t_mem >= t_compute else "compute", bandwidth_bps=dev.bandwidth_bps,
             peak_flops=peak, tp=s.tp, copy_share=COPY_BANDWIDTH.value, gemm_share=gemm,
             decode_share=row.decode.value, decode_share_source=f"{row.decode.source}: {row.decode.figure}"),
        term("generate.prefill_seconds", prefill, "s",
             "prompt FLOPs (resolve.flops) / (peak x tp x GEMM share x prefill share) + TP all-reduce",
             prompt_tokens=prompt, prefill_share=row.prefill.value,
             prefill_share_source=f"{row.prefill.source}: {row.prefill.figure}"),
        term("generate.tokens_per_second", tps, "tokens/s",
             "dp x mean output / (mean output x step / batch + prefill) x calibration",
             dp=s.dp, calibration=s.calibration, calibrated=s.calibrated,
             calibration_source=("measured (hardware.calibrated.serving_ratio)" if s.calibrated
                                 else "none: predicted from facts and engine measurements")),
        term("generate.seconds", seconds, "s", "output tokens / tokens_per_second",
             output_tokens=tokens.output,
             mtp="planned as off (MTP only speeds decode up; the estimate stays conservative)"),
    )
    return Generation(s, tps, seconds, terms)
