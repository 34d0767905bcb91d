"""Generation time: SGLang's batched decode and prefill, predicted from facts (no fitted factor).

Per replica (a TP group of `tp` GPUs) decoding `batch` sequences (`serving.running_batch`):
  bytes/step = decoder weights + LM head + batch x (KV bytes/token x mean context + 2 x state)
               (every step reads the weights and each sequence's KV, reads and writes its state)
  FLOPs/step = batch x (2 x matmul parameters + 4 x context x heads x head_dim x attention layers)
  roofline   = max(bytes / (bandwidth x tp x copy share), FLOPs / (peak x tp x GEMM share))
               (both shares measured; GEMM share per precision)
  step       = roofline(served weights) + roofline(16-bit weights) x (1 / decode share - 1)
               + TP all-reduce (2 per layer, ring over the interconnect:
               latency + 2 (tp-1)/tp x batch x hidden x 2 bytes / link bandwidth)
  prefill    = prompt FLOPs at the 16-bit GEMM ceiling / prefill share, with the weight GEMMs'
               part (2 x parameters x prompt) re-timed at the served precision's ceiling
               + its all-reduces
  tokens/s   = dp x Ō / (Ō x step / batch + prefill) x calibration
The engine shares were measured with 16-bit weights: the part of a step they stand for beyond the
roofline (launch gaps, normalizations, sampling, the linear-attention scan) does not get faster with
FP8 weights, which speed up only the weight reads and the weight matrix products (Amdahl).
The shares are engine facts with their sources (`engine.py`); `calibration` is
`hardware.calibrated.serving_ratio` (measured / this model's prediction on the rented node), 1 when
none. `estimate_generation` takes the output-length distribution so that ranges can call it per
scenario.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.plan.estimates.device import CALIBRATED_SERVING, Device, device_of, factor
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


def _sixteen_bit(weight_dtype: str) -> str:
    """The precision the engine shares were measured in: 16-bit, or fp32 on the CPU."""
    return "fp32" if weight_dtype == "fp32" else "bf16"


@dataclass(frozen=True)
class Roofline:
    bytes: float
    memory_s: float
    compute_s: float
    peak: float
    gemm: float

    @property
    def seconds(self) -> float:
        return max(self.memory_s, self.compute_s)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"


def _gemm(recipe: ResolvedRecipe, dtype: str) -> float:
    return gemm_share(dtype if recipe.hardware.gpu is not None else "bf16").value


def _decode_roofline(recipe: ResolvedRecipe, dev: Device, b: Batch, dtype: str) -> Roofline:
    """One decode step's bytes and FLOPs against the measured ceilings, with weights in `dtype` (the KV
    cache as served)."""
    batch, context, kv = max(b.value, 1), b.mean_context, b.kv_elem_bytes
    facts, s = recipe.target.facts, recipe.stages.generate.serving
    step_bytes = decode_read_bytes(facts, dtype) + batch * (
        facts.kv_bytes_per_token(kv) * context + 2 * facts.recurrent_state_bytes)
    peak, gemm = dev.peak_flops(dtype), _gemm(recipe, dtype)
    return Roofline(step_bytes, step_bytes / (dev.bandwidth_bps * s.tp * COPY_BANDWIDTH.value),
                    batch * flops_per_token(facts, context) / (peak * s.tp * gemm), peak, gemm)


@dataclass(frozen=True)
class Prefill:
    weight_gemm_s: float
    other_s: float

    @property
    def seconds(self) -> float:
        return self.weight_gemm_s + self.other_s


def _prefill(recipe: ResolvedRecipe, dev: Device, prompt: float, dtype: str, share: float) -> Prefill:
    """A prompt's prefill: all of it at the 16-bit rate over the engine's prefill share, except the
    weight GEMMs, which run at the served precision's measured ceiling."""
    facts, tp = recipe.target.facts, recipe.stages.generate.serving.tp
    ref = _sixteen_bit(dtype)
    rate_ref = dev.peak_flops(ref) * tp * _gemm(recipe, ref)
    weight_flops = 2.0 * facts.params_through_layer(facts.num_layers - 1) * prompt
    total_ref = target_forward_flops(facts, facts.num_layers - 1, [prompt]) / (rate_ref * share)
    other = total_ref - weight_flops / rate_ref
    return Prefill(weight_flops / (dev.peak_flops(dtype) * tp * _gemm(recipe, dtype)), other)


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
    served = _decode_roofline(recipe, dev, b, s.weight_dtype)
    sixteen = _decode_roofline(recipe, dev, b, _sixteen_bit(s.weight_dtype))
    t_allreduce = allreduce_seconds(recipe, batch)
    overhead = sixteen.seconds * (1 / row.decode.value - 1)
    step = served.seconds + overhead + t_allreduce
    prompt = tokens.prompt_mean
    pre = _prefill(recipe, dev, prompt, s.weight_dtype, row.prefill.value)
    prefill = pre.seconds + allreduce_seconds(recipe, prompt)
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
        term("generate.step_bytes", served.bytes, "bytes",
             "decoder weights + LM head + batch x (KV bytes/token x mean context + 2 x state)",
             weight_bytes=s.weight_bytes, batch=batch),
        term("generate.step_seconds", step, "s",
             "roofline(served weights) + roofline(16-bit weights) x (1 / decode share - 1) + TP all-reduce; "
             "roofline = max(bytes / (bandwidth x tp x copy share), FLOPs / (peak x tp x GEMM share))",
             memory_s=served.memory_s, compute_s=served.compute_s, overhead_s=overhead, allreduce_s=t_allreduce,
             bound=served.bound, bandwidth_bps=dev.bandwidth_bps, peak_flops=served.peak, tp=s.tp,
             copy_share=COPY_BANDWIDTH.value, gemm_share=served.gemm, decode_share=row.decode.value,
             decode_share_source=f"{row.decode.source}: {row.decode.figure}",
             overhead_note="the share was measured with 16-bit weights; FP8 does not shorten what it stands for"),
        term("generate.prefill_seconds", prefill, "s",
             "prompt FLOPs (resolve.flops) / (16-bit peak x tp x GEMM share x prefill share), the weight "
             "GEMMs (2 x parameters x prompt) re-timed at the served precision's ceiling, + TP all-reduce",
             prompt_tokens=prompt, prefill_share=row.prefill.value, weight_gemm_s=pre.weight_gemm_s,
             other_s=pre.other_s, prefill_share_source=f"{row.prefill.source}: {row.prefill.figure}"),
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
