"""One forward pass of a serving replica against the measured ceilings: the roofline, the engine's
overhead and the TP all-reduce (the primitives of `generation.py` and `speculative.py`).

A forward of `tokens` tokens for each of `batch` running sequences (1 for plain decode; the verified
tokens for a speculative verify) reads
  bytes = decoder weights but the routed experts (served dtype) + LM head (16-bit)
          + batch x (KV bytes/token x mean context + state passes x linear-attention state)
and computes batch x tokens x (2 x matmul parameters but the routed experts + 4 x context x heads x
head_dim x attention layers).
  roofline(dtype) = max(bytes / (bandwidth x tp x copy share), FLOPs / (peak x tp x GEMM share))
  step            = roofline(served) + roofline(16-bit) x (1 / decode share - 1) + TP all-reduce
                    + MoE layers x `moe.moe_layer`(batch x tokens) (SGLang's path, CUDA graph)
The engine's decode share was measured with 16-bit weights: what it stands for beyond the roofline
(launch gaps, normalizations, sampling, the scan) does not shrink with FP8 weights (Amdahl). The routed
experts are timed once, by `moe.py` (rows per expert, grouped-GEMM efficiency, kernel floors), not by the
roofline or the share. A prompt's prefill is `prefill.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.config.fields import PRECISION_BYTES
from dflashx.plan.estimates.device import Device
from dflashx.plan.estimates.engine import (
    ALLREDUCE_LATENCY_NVLINK, ALLREDUCE_LATENCY_PCIE, COPY_BANDWIDTH, NVLINK_CLASS_GBS, EngineRow, gemm_share,
)
from dflashx.plan.estimates.moe import MoeLayer, moe_layer, routed_flops_per_token, serving_path
from dflashx.plan.estimates.serving import Batch
from dflashx.resolve.model import ResolvedRecipe
from dflashx.targets.registry import TargetFacts


def matmul_params(facts: TargetFacts) -> int:
    """Parameters multiplied per decoded token: every layer (of an MoE layer, the top-k experts) plus
    the LM head (embedding lookup is free)."""
    return facts.params_through_layer(facts.num_layers - 1, active=True) + facts.vocab_size * facts.hidden_size


def flops_per_token(facts: TargetFacts, context: float) -> float:
    """A decoded token's FLOPs outside the routed experts (`moe.py` times those)."""
    attention = 4 * context * facts.num_attention_heads * facts.head_dim * facts.num_kv_layers
    return 2 * matmul_params(facts) - routed_flops_per_token(facts, facts.num_moe_layers) + attention


def head_bytes(facts: TargetFacts, weight_dtype: str) -> float:
    """The LM head stays 16-bit (32-bit for fp32) whatever the decoder layers are served in."""
    return facts.vocab_size * facts.hidden_size * (4 if weight_dtype == "fp32" else 2)


def dense_read_bytes(facts: TargetFacts, weight_dtype: str) -> float:
    """Weights every forward reads whatever its tokens: the decoder layers but the routed experts (whose
    touched share `moe.py` reads) at the served dtype, the LM head at 16 bits."""
    dense = facts.params_through_layer(facts.num_layers - 1) - facts.routed_expert_params
    return dense * PRECISION_BYTES[weight_dtype] + head_bytes(facts, weight_dtype)


def sixteen_bit(weight_dtype: str) -> str:
    """The precision the engine shares were measured in: 16-bit, or fp32 on the CPU."""
    return "fp32" if weight_dtype == "fp32" else "bf16"


def allreduce_seconds(recipe: ResolvedRecipe, tokens: float) -> float:
    """2 ring all-reduces per layer of `tokens` x hidden 16-bit activations over the TP group."""
    tp, hw = recipe.stages.generate.serving.tp, recipe.hardware
    if tp <= 1 or hw.interconnect_gbs is None:
        return 0.0
    nvlink = hw.interconnect_gbs >= NVLINK_CLASS_GBS
    latency = (ALLREDUCE_LATENCY_NVLINK if nvlink else ALLREDUCE_LATENCY_PCIE).value
    payload = 2 * (tp - 1) / tp * tokens * recipe.target.facts.hidden_size * 2
    return 2 * recipe.target.facts.num_layers * (latency + payload / (hw.interconnect_gbs * 1e9))


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


def gemm(recipe: ResolvedRecipe, dtype: str) -> float:
    return gemm_share(dtype if recipe.hardware.gpu is not None else "bf16").value


def roofline(recipe: ResolvedRecipe, dev: Device, step_bytes: float, flops: float, dtype: str) -> Roofline:
    """`step_bytes` and `flops` of one forward of a TP group against the measured ceilings in `dtype`."""
    tp = recipe.stages.generate.serving.tp
    peak, share = dev.peak_flops(dtype), gemm(recipe, dtype)
    return Roofline(step_bytes, step_bytes / (dev.bandwidth_bps * tp * COPY_BANDWIDTH.value),
                    flops / (peak * tp * share), peak, share)


def target_roofline(recipe: ResolvedRecipe, dev: Device, b: Batch, dtype: str, tokens: int = 1,
                    state_passes: float = 2.0) -> Roofline:
    """One target forward of `tokens` tokens per running sequence, weights in `dtype` (the KV cache as
    served); each sequence's linear-attention state is moved `state_passes` times (read + write: 2)."""
    batch, context, kv = max(b.value, 1), b.mean_context, b.kv_elem_bytes
    facts = recipe.target.facts
    step_bytes = dense_read_bytes(facts, dtype) + batch * (
        facts.kv_bytes_per_token(kv) * context + state_passes * facts.recurrent_state_bytes)
    return roofline(recipe, dev, step_bytes, batch * tokens * flops_per_token(facts, context), dtype)


@dataclass(frozen=True)
class Step:
    """One engine forward: the roofline in the served precision, the engine overhead, the all-reduce and
    the MoE layers' routed experts (`moe.py`; None for a dense forward)."""

    served: Roofline
    overhead_s: float
    allreduce_s: float
    moe: MoeLayer | None = None
    moe_layers: int = 0

    @property
    def moe_s(self) -> float:
        return self.moe.seconds * self.moe_layers if self.moe else 0.0

    @property
    def seconds(self) -> float:
        return self.served.seconds + self.overhead_s + self.allreduce_s + self.moe_s


def moe_forward(recipe: ResolvedRecipe, dev: Device, row: EngineRow, tokens: float, dtype: str,
                graphed: bool) -> MoeLayer | None:
    """One of the target's MoE layers given `tokens` tokens on the engine's path (None: a dense target)."""
    facts = recipe.target.facts
    if not facts.is_moe:
        return None
    path = serving_path(row.engine, recipe.hardware.gpu is not None, graphed)
    return moe_layer(facts, tokens, dtype, dev, path, recipe.stages.generate.serving.tp)


def overhead_seconds(sixteen: Roofline, row: EngineRow, calls: int) -> float:
    """What the engine's decode share stands for beyond the roofline, at its 16-bit time, plus a
    launch-bound engine's fixed time for each of the forward's `calls` layer calls."""
    fixed = row.call_latency.value * calls if row.call_latency else 0.0
    return sixteen.seconds * (1 / row.decode.value - 1) + fixed


def target_step(recipe: ResolvedRecipe, dev: Device, b: Batch, row: EngineRow, tokens: int = 1,
                state_passes: float = 2.0) -> Step:
    """A target forward of `tokens` tokens for each of the batch's sequences (module doc)."""
    dtype = recipe.stages.generate.serving.weight_dtype
    served = target_roofline(recipe, dev, b, dtype, tokens, state_passes)
    sixteen = target_roofline(recipe, dev, b, sixteen_bit(dtype), tokens, state_passes)
    facts = recipe.target.facts
    calls, routed = facts.num_layers + 1, max(b.value, 1) * tokens
    per_step = row.step_latency.value if row.step_latency else 0.0
    return Step(served, overhead_seconds(sixteen, row, calls) + per_step, allreduce_seconds(recipe, routed),
                moe_forward(recipe, dev, row, routed, dtype, graphed=True), facts.num_moe_layers)
