"""What one MoE layer costs at the tokens it is given: the one function decode, prefill, speculative
verification (MTP, the DFlash drafter's predicted speed-up) and the trainer's target forward use (pure).

At T tokens an MoE layer with E routed experts, top-k, expert width i and hidden size h:
  touched  = E (1 - (1 - k/E)^T) experts (`TargetFacts.expected_experts_touched`: uniform routing)
  r        = T k / touched rows per touched expert
  grouped GEMMs (gate_up h -> 2i, down i -> h; SGLang's two `fused_moe_kernel` calls, transformers'
           two `torch._grouped_mm` calls) =
             max(weight bytes of the touched experts / (bandwidth x GROUPED_READ),
                 2 T k x 3 h i / (peak(dtype) x GEMM share(dtype) x efficiency(r)))
             + 2 x GROUPED_FIXED
  floors   = the path's other kernels x the floor of one kernel: CUDA-graph replay (SGLang decode and
             verify) or eager launch (SGLang prefill, the trainer); added to the work, not overlapped: the
             transformers block's eager time at 1,024+ tokens is its GPU work plus 0.63-0.79 ms, more than
             its kernels x the eager floor (benchmarks/results/moe_layer.json `block`)
  movement = activations the non-GEMM kernels read and write, per routed row, / (bandwidth x copy share)
  seconds  = grouped GEMMs + floors + movement; with TP the experts' bytes and FLOPs split over tp GPUs.
The rest of the layer (attention, norms, shared experts, router weights) stays in the dense roofline
(`decode.py`) or the dense MFU (`training.py`): the routed experts are counted here only.

Where the constants come from: every figure is `python -m benchmarks.moe_layer` on one H200 (torch 2.11,
transformers 5.17; `benchmarks/results/moe_layer.json`), reduced by `benchmarks/moe_constants.py`
(tests/test_plan_moe_layer.py checks them against the JSON); none is fitted to a planner row. On other
GPUs the bandwidth and GEMM figures carry as shares of the datasheet (as engine.py's), the fixed
cost and floors in seconds. Efficiency is against the dense bf16 GEMM measured in the same run, so it
multiplies engine.py's dense GEMM ceiling of the dtype (FP8 experts: the FP8 ceiling at the same
efficiency, not measured). Below 64 rows per expert the grouped GEMM reads at its memory-bound rate in
every measured shape, so the efficiency there is not observable: it is held at the 64-row figure and
the memory term binds. Where nothing here was measured, the experts are the plain roofline (`ROOFLINE`:
bytes at the copy share, FLOPs at the GEMM share, no fixed cost or floor): without a GPU (the CPU profile),
and for a serving engine other than SGLang even on a GPU (`serving_path`: the in-process and transformers
rows carry their own per-call latency).
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.plan.estimates.device import Device
from dflashx.plan.estimates.engine import COPY_BANDWIDTH, Measured, gemm_share
from dflashx.resolve.serving import expert_elem_bytes
from dflashx.targets.registry import TargetFacts
from dflashx.plan.estimates.interpolate import log_interpolate

_JSON = "benchmarks/results/moe_layer.json (python -m benchmarks.moe_layer; reduced by benchmarks/moe_constants.py)"
_H200 = "1x NVIDIA H200, torch 2.11 + CUDA 13, transformers 5.17, 2026-12-06"

GROUPED_READ = Measured(
    0.646, _JSON,
    "torch._grouped_mm at every registered MoE target's expert shapes, rows per expert <= 64 (112 timings): "
    "least-squares time = 49.6 us + weight bytes of the touched experts / 3.10 TB/s; 3.10 of the 4.8 TB/s datasheet",
    _H200)
GROUPED_FIXED = Measured(
    49.6e-6, _JSON, "the same least-squares fit's intercept: 49.6 us per grouped GEMM, one call timed between CUDA "
    "events (the host's launch gap included: replayed in a CUDA graph the intercept is 18.0 us on an H100, "
    "benchmarks/results/moe_grouped_graph.json; an upper bound on SGLang's graphed decode, docs/planner.md)", _H200)
# (rows per touched expert, efficiency against the dense bf16 GEMM of the same run, 745 TFLOP/s): the median over
# the five targets and both projections of FLOPs / ((time - GROUPED_FIXED) x 745 TFLOP/s), rows within a factor
# sqrt(2) of each bucket.
EFFICIENCY: tuple[tuple[float, float], ...] = (
    (64, 0.281), (128, 0.406), (256, 0.657), (512, 0.722), (1024, 0.783), (2048, 0.793))
GRAPH_FLOOR = Measured(1.07e-6, _JSON, "1,000 trivial kernels replayed in one CUDA graph: 1.07 us each", _H200)
EAGER_FLOOR = Measured(6.88e-6, _JSON, "1,000 trivial kernels launched eagerly from Python: 6.88 us each", _H200)
TRANSFORMERS_ROW_BYTES = Measured(
    66.3, _JSON,
    "transformers' sparse MoE block (grouped_mm) eager time less its two grouped GEMMs, 1,024-16,384 tokens: "
    "least-squares slope 30.9 ns (qwen3_moe) and 33.1 ns (qwen3_5_moe) per routed row = 131 and 140 kB at the "
    "copy rate (0.884 x 4.8 TB/s), 64.1 and 68.5 bytes per hidden element: their mean",
    _H200)

_SGLANG = ("sgl-project/sglang python/sglang/srt/layers/moe/fused_moe_triton/fused_moe.py @639afce, "
           "`fused_experts_impl`")


@dataclass(frozen=True)
class MoePath:
    """How an engine runs an MoE layer besides its two grouped GEMMs: its other kernels, whether they are
    replayed in a CUDA graph, and the activation bytes they move per routed row (bytes_h x h + bytes_i x i)."""

    name: str
    kernels: int
    shared_kernels: int  # added when the layer has a shared expert (gate, scale, add)
    fp8_kernels: int  # added with FP8 experts (activation quantization per grouped GEMM)
    graphed: bool
    bytes_h: float
    bytes_i: float
    source: str
    measured: bool = True  # False: no GPU; the plain roofline (module doc)

    def other_kernels(self, facts: TargetFacts, dtype: str) -> int:
        return (self.kernels + (self.shared_kernels if facts.num_shared_experts else 0)
                + (self.fp8_kernels if dtype == "fp8" else 0))


# SGLang's Triton fused-MoE path: router GEMM, topk_softmax, moe_align_block_size, [w13 fused_moe_kernel],
# silu_and_mul, [w2 fused_moe_kernel, routed weights multiplied in], moe_sum_reduce: 5 kernels besides the two
# GEMMs; FP8 quantizes the activations before each GEMM (+2); a shared expert's gate adds its h -> 1 GEMM and the
# sigmoid-scale-add (+2; its MLP is dense, in the roofline). Moved per routed row: silu_and_mul reads 2i, writes i;
# moe_sum_reduce reads h (16-bit).
_SGLANG_KERNELS = (f"{_SGLANG}: router GEMM, topk_softmax, moe_align_block_size, silu_and_mul, moe_sum_reduce "
                   "(+ per-token FP8 quantization before each fused_moe_kernel; + a shared expert's gate)")
SGLANG_DECODE = MoePath("sglang (CUDA graph)", 5, 2, 2, True, 2.0, 6.0, _SGLANG_KERNELS)
SGLANG_PREFILL = MoePath("sglang (eager prefill)", 5, 2, 2, False, 2.0, 6.0, _SGLANG_KERNELS)
# transformers' `grouped_mm` experts (transformers/integrations/moe.py `grouped_mm_experts_forward`): the profiler's
# CUDA kernels per block at 1,024+ tokens, 56 (qwen3_moe) and 65 (qwen3_5_moe, shared expert), less the two grouped
# GEMMs; movement measured (TRANSFORMERS_ROW_BYTES).
TRANSFORMERS_TRAIN = MoePath(
    "transformers grouped_mm (eager)", 54, 9, 0, False, TRANSFORMERS_ROW_BYTES.value, 0.0,
    f"{_JSON} `block`: 56 CUDA kernels per qwen3_moe block, 65 with qwen3_5_moe's shared expert (1,024+ tokens)")
ROOFLINE = MoePath("roofline (no GPU)", 0, 0, 0, False, 0.0, 0.0, "no GPU: the experts at the plain roofline",
                   measured=False)


def efficiency(rows: float) -> float:
    """The grouped GEMM's efficiency at `rows` per expert: EFFICIENCY interpolated in log(rows), held at its
    ends (below 64 rows memory binds: module doc)."""
    return log_interpolate(EFFICIENCY, rows)


@dataclass(frozen=True)
class MoeLayer:
    """One MoE layer at `tokens` tokens on one GPU of a TP group (module doc)."""

    path: str
    tokens: float
    touched: float
    rows_per_expert: float
    efficiency: float
    weight_bytes: float
    flops: float
    memory_s: float
    compute_s: float
    fixed_s: float
    kernels: int
    floor_s: float
    movement_s: float

    @property
    def gemm_s(self) -> float:
        return max(self.memory_s, self.compute_s) + self.fixed_s

    @property
    def seconds(self) -> float:
        return self.gemm_s + self.floor_s + self.movement_s

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"

    def inputs(self) -> dict[str, float | str | int]:
        return {"path": self.path, "tokens": self.tokens, "experts_touched": self.touched,
                "rows_per_expert": self.rows_per_expert, "efficiency": self.efficiency, "bound": self.bound,
                "memory_s": self.memory_s, "compute_s": self.compute_s, "fixed_s": self.fixed_s,
                "kernels": self.kernels, "floor_s": self.floor_s, "movement_s": self.movement_s,
                "seconds": self.seconds}


def routed_flops_per_token(facts: TargetFacts, moe_layers: int) -> float:
    """The routed experts' FLOPs per token over `moe_layers` MoE layers (top-k experts, 2 per weight): the part
    of the FLOP model this module times; the dense roofline and MFU take the rest."""
    return 2.0 * moe_layers * facts.num_experts_per_tok * facts.expert_params


def touched_bytes(facts: TargetFacts, tokens: float, dtype: str, tp: int = 1) -> float:
    """Weight bytes of the routed experts `tokens` tokens touch in one MoE layer, experts in `dtype`, on one GPU
    of a TP group (uniform routing: `TargetFacts.expected_experts_touched`)."""
    return facts.expected_experts_touched(tokens) * facts.expert_params * expert_elem_bytes(facts, dtype) / tp


def moe_layer(facts: TargetFacts, tokens: float, dtype: str, dev: Device, path: MoePath, tp: int = 1) -> MoeLayer:
    """One MoE layer given `tokens` tokens, experts in `dtype` (module doc)."""
    n = max(tokens, 0.0)
    touched = facts.expected_experts_touched(n) if n > 0 else 0.0
    rows = n * facts.num_experts_per_tok / touched if touched else 0.0
    weight_bytes = touched_bytes(facts, n, dtype, tp)
    flops = n * routed_flops_per_token(facts, 1) / tp
    if not path.measured:
        return MoeLayer(path.name, n, touched, rows, 1.0, weight_bytes, flops,
                        weight_bytes / (dev.bandwidth_bps * COPY_BANDWIDTH.value),
                        flops / (dev.peak_flops(dtype) * gemm_share("bf16").value), 0.0, 0, 0.0, 0.0)
    eff = efficiency(rows)
    memory_s = weight_bytes / (dev.bandwidth_bps * GROUPED_READ.value)
    compute_s = flops / (dev.peak_flops(dtype) * gemm_share(dtype).value * eff)
    kernels = path.other_kernels(facts, dtype)
    floor = (GRAPH_FLOOR if path.graphed else EAGER_FLOOR).value * kernels
    moved = n * facts.num_experts_per_tok * (path.bytes_h * facts.hidden_size
                                             + path.bytes_i * facts.moe_intermediate_size) / tp
    return MoeLayer(path.name, n, touched, rows, eff, weight_bytes, flops, memory_s, compute_s,
                    2 * GROUPED_FIXED.value if n > 0 else 0.0, kernels, floor if n > 0 else 0.0,
                    moved / (dev.bandwidth_bps * COPY_BANDWIDTH.value))


def moe_layers_seconds(facts: TargetFacts, layers: int, tokens: float, dtype: str, dev: Device, path: MoePath,
                       tp: int = 1) -> float:
    """`layers` MoE layers each given `tokens` tokens (0 for a dense target)."""
    if not facts.is_moe or layers <= 0:
        return 0.0
    return layers * moe_layer(facts, tokens, dtype, dev, path, tp).seconds


def serving_path(engine: str, on_gpu: bool, graphed: bool) -> MoePath:
    """The MoE path of a serving engine: SGLang's (graph-replayed decode/verify, eager prefill) on a GPU,
    else the plain roofline (the in-process and transformers rows carry their own per-call latency)."""
    if not on_gpu or engine != "sglang":
        return ROOFLINE
    return SGLANG_DECODE if graphed else SGLANG_PREFILL


@dataclass(frozen=True)
class TrainerMoe:
    """The routed experts of the trainer's target forward, per sample: their FLOPs (which leave the
    dense-MFU time) and their time on transformers' grouped_mm path (`moe_layer` per MoE layer run)."""

    layers: int  # MoE layers the forward runs through
    routed_flops: float
    seconds: float
    layer: MoeLayer | None  # at the mean micro step's tokens, for --explain


def trainer_moe(facts: TargetFacts, deepest: int, lengths: list[float], micro_batch: int, dtype: str,
                dev: Device) -> TrainerMoe:
    """Per sample, averaged over samples of `lengths` tokens: the target forward through layers 0..deepest
    runs each MoE layer on a micro step of `micro_batch` such samples (module doc; 0 for a dense target)."""
    layers = sum(facts.is_moe_layer(i) for i in range(deepest + 1)) if facts.is_moe else 0
    if not layers or not lengths:
        return TrainerMoe(0, 0.0, 0.0, None)
    path = TRANSFORMERS_TRAIN if dev.memory_bytes is not None else ROOFLINE
    routed = routed_flops_per_token(facts, layers) * sum(lengths) / len(lengths)
    seconds = sum(moe_layers_seconds(facts, layers, n * micro_batch, dtype, dev, path) / micro_batch
                  for n in lengths) / len(lengths)
    mean = sum(lengths) / len(lengths) * micro_batch
    return TrainerMoe(layers, routed, seconds, moe_layer(facts, mean, dtype, dev, path))
