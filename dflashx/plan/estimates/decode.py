"""One forward pass of a serving replica against the measured ceilings: the roofline of each kind of kernel,
the engine's overhead and the TP all-reduce (the primitives of `generation.py` and `speculative.py`).

A forward of `tokens` tokens for each of `batch` running sequences (1 for plain decode; the verified tokens for
a speculative verify; T = batch x tokens in all) runs three kinds of kernels, one after another, each at its own
roofline (memory or compute, whichever binds), so the forward is their sum:
  weights    reads the decoder weights but the routed experts (served dtype) + LM head (16-bit) once and
             multiplies T x 2 x matmul parameters but the routed experts, at the served precision's GEMM
             ceiling x the measured efficiency of a dense GEMM of T rows (`gemm.py`: 1 at 8,192 rows, less
             below; on the CPU 1)
  attention  reads each sequence's KV once, batch x KV bytes/token x mean context (the verified tokens of a
             sequence share it), and computes T x 4 x context x heads x head_dim x attention layers, at the
             16-bit ceiling
  state      moves each sequence's linear-attention state `state passes` times (read + write: 2)
  roofline(part) = max(bytes / (bandwidth x tp x copy share), FLOPs / (peak x tp x GEMM share x efficiency))
  step           = sum of the parts (served) + the same at 16 bits x (1 / decode share - 1) + TP all-reduce
                   + MoE layers x `moe.moe_layer`(T) (SGLang's path, CUDA graph)
At plain decode every part is memory-bound and the sum is the bytes over the bandwidth, as one roofline of the
whole step would give; where the verify's T x 2 x parameters outgrow the weights' read (a few hundred tokens on
an H100 or B200), the weight GEMMs turn compute-bound while each sequence's KV and state reads stay memory-bound
beside them: the physics that ends the speculative speed-up at high concurrency.
The engine's decode share was measured with 16-bit weights: what it stands for beyond the roofline (launch gaps,
normalizations, sampling, the scan) does not shrink with FP8 weights (Amdahl). The routed experts are timed once,
by `moe.py` (rows per expert, grouped-GEMM efficiency, kernel floors), not by the roofline or the share. A
prompt's prefill is `prefill.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from dflashx.config.fields import PRECISION_BYTES
from dflashx.plan.estimates.device import Device
from dflashx.plan.estimates.engine import (
    ALLREDUCE_LATENCY_NVLINK, ALLREDUCE_LATENCY_PCIE, COPY_BANDWIDTH, NVLINK_CLASS_GBS, EngineRow, gemm_share,
)
from dflashx.plan.estimates.gemm import dense_efficiency
from dflashx.plan.estimates.moe import MoeLayer, moe_layer, routed_flops_per_token, serving_path
from dflashx.plan.estimates.serving import Batch
from dflashx.plan.expr import Expr, const, maximum, named, total, var
from dflashx.resolve.model import ResolvedRecipe
from dflashx.targets.registry import TargetFacts


def matmul_params(facts: TargetFacts) -> int:
    """Parameters multiplied per decoded token: every layer (of an MoE layer, the top-k experts) plus
    the LM head (embedding lookup is free)."""
    return facts.params_through_layer(facts.num_layers - 1, active=True) + facts.vocab_size * facts.hidden_size


def weight_flops_per_token(facts: TargetFacts) -> float:
    """A decoded token's weight-GEMM FLOPs outside the routed experts (`moe.py` times those)."""
    return 2 * matmul_params(facts) - routed_flops_per_token(facts, facts.num_moe_layers)


def attention_flops_per_token(facts: TargetFacts, context: float) -> float:
    """A decoded token's attention FLOPs over `context` tokens of KV (scores and values, every attention layer)."""
    return 4 * context * facts.num_attention_heads * facts.head_dim * facts.num_kv_layers


def flops_per_token(facts: TargetFacts, context: float) -> float:
    """A decoded token's FLOPs outside the routed experts: its weight GEMMs and its attention."""
    return weight_flops_per_token(facts) + attention_flops_per_token(facts, context)


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
class Part:
    """One kind of kernel of a forward (module doc) at its own roofline."""

    name: str  # "weights", "attention", "state" (a draft's forward: "forward" when not split)
    bytes: float
    flops: float
    memory_s: float
    compute_s: float

    @cached_property
    def time(self) -> Expr:
        """The part's seconds: the slower of its memory and its compute ceiling."""
        return maximum(var(f"{self.name}_memory_s", self.memory_s), var(f"{self.name}_compute_s", self.compute_s))

    @property
    def seconds(self) -> float:
        return self.time.value

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"


@dataclass(frozen=True)
class Roofline:
    """A forward's parts, run one after another: its time is the sum of theirs."""

    parts: tuple[Part, ...]
    peak: float
    gemm: float
    efficiency: float = 1.0  # the weight GEMMs' efficiency at the forward's tokens (`gemm.py`)

    @property
    def bytes(self) -> float:
        return sum(p.bytes for p in self.parts)

    @property
    def memory_s(self) -> float:
        return sum(p.memory_s for p in self.parts)

    @property
    def compute_s(self) -> float:
        return sum(p.compute_s for p in self.parts)

    @cached_property
    def time(self) -> Expr:
        """The forward's seconds: its parts one after another."""
        return total(*(named(f"{p.name}_s", p.time) for p in self.parts))

    @property
    def seconds(self) -> float:
        return self.time.value

    @property
    def bound(self) -> str:
        """The weight GEMMs' bound (the first part's): "compute" once the tokens outgrow the weights' read."""
        return self.parts[0].bound if self.parts else "memory"

    def inputs(self) -> dict[str, dict[str, float | str]]:
        return {p.name: {"bytes": p.bytes, "flops": p.flops, "memory_s": p.memory_s, "compute_s": p.compute_s,
                         "seconds": p.seconds, "bound": p.bound} for p in self.parts}


def gemm(recipe: ResolvedRecipe, dtype: str) -> float:
    return gemm_share(dtype if recipe.hardware.gpu is not None else "bf16").value


def part(recipe: ResolvedRecipe, dev: Device, name: str, step_bytes: float, flops: float, dtype: str,
         efficiency: float = 1.0) -> Part:
    """`step_bytes` and `flops` of one kind of kernel of a TP group's forward against the ceilings in `dtype`."""
    tp = recipe.stages.generate.serving.tp
    rate = dev.peak_flops(dtype) * tp * gemm(recipe, dtype) * efficiency
    return Part(name, step_bytes, flops, step_bytes / (dev.bandwidth_bps * tp * COPY_BANDWIDTH.value), flops / rate)


def roofline(recipe: ResolvedRecipe, dev: Device, step_bytes: float, flops: float, dtype: str) -> Roofline:
    """`step_bytes` and `flops` of one forward taken as a single kind of kernel, in `dtype`."""
    return Roofline((part(recipe, dev, "forward", step_bytes, flops, dtype),), dev.peak_flops(dtype),
                    gemm(recipe, dtype))


def gemm_efficiency(recipe: ResolvedRecipe, tokens: float) -> float:
    """The dense weight GEMMs' efficiency at `tokens` rows: measured on a GPU (`gemm.py`), 1 on the CPU."""
    return dense_efficiency(tokens) if recipe.hardware.gpu is not None else 1.0


def target_roofline(recipe: ResolvedRecipe, dev: Device, b: Batch, dtype: str, tokens: int = 1,
                    state_passes: float = 2.0) -> Roofline:
    """One target forward of `tokens` tokens per running sequence, weights in `dtype` (the KV cache as
    served); each sequence's linear-attention state is moved `state_passes` times (read + write: 2)."""
    batch, context, kv = max(b.value, 1), b.mean_context, b.kv_elem_bytes
    facts, rows = recipe.target.facts, max(b.value, 1) * tokens
    efficiency, attention_dtype = gemm_efficiency(recipe, rows), sixteen_bit(dtype)
    parts = (part(recipe, dev, "weights", dense_read_bytes(facts, dtype), rows * weight_flops_per_token(facts),
                  dtype, efficiency),
             part(recipe, dev, "attention", batch * facts.kv_bytes_per_token(kv) * context,
                  rows * attention_flops_per_token(facts, context), attention_dtype),
             part(recipe, dev, "state", batch * state_passes * facts.recurrent_state_bytes, 0.0, attention_dtype))
    return Roofline(parts, dev.peak_flops(dtype), gemm(recipe, dtype), efficiency)


@dataclass(frozen=True)
class Step:
    """One engine forward: the roofline in the served precision, the engine overhead, the all-reduce and
    the MoE layers' routed experts (`moe.py`; None for a dense forward)."""

    served: Roofline
    overhead_s: float
    allreduce_s: float
    moe: MoeLayer | None = None
    moe_layers: int = 0
    mixer_s: float = 0.0  # a verify's linear-attention scan over its tokens beyond one per sequence (prefill.py)

    @property
    def moe_s(self) -> float:
        return self.moe.seconds * self.moe_layers if self.moe else 0.0

    @cached_property
    def time(self) -> Expr:
        """The forward's seconds: the served roofline, the engine overhead, the all-reduce, the routed experts
        (MoE layers x one layer's `moe_layer`) and a verify's scan."""
        moe = var("moe_layer_s", self.moe.seconds) * var("moe_layers", self.moe_layers) if self.moe else const(0.0)
        return total(named("served_s", self.served.time), var("overhead_s", self.overhead_s),
                     var("allreduce_s", self.allreduce_s), named("moe_s", moe), var("mixer_s", self.mixer_s))

    @property
    def seconds(self) -> float:
        return self.time.value


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
