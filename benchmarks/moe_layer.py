"""What an MoE layer costs on this GPU at the token counts that serving, prefill, verification and training give it.

Usage (on a GPU machine): python -m benchmarks.moe_layer [--parts floors grouped block forward] [--out PATH]
Prints a table per part as it finishes and writes benchmarks/results/moe_layer.json. Parts:

  floors   the time of one trivial kernel: launched eagerly from Python, and replayed inside a CUDA graph
           (the two ways an engine issues an MoE layer's small kernels: training and prefill run eagerly,
           SGLang's decode and verify replay captured graphs)
  grouped  torch's grouped matmul (the op under transformers' `grouped_mm` experts) at each registered MoE
           target's expert shapes, gate_up (hidden -> 2 x moe_intermediate) and down (moe_intermediate ->
           hidden), for tokens routed uniformly at random to top-k of E experts: time, rows per active
           expert, and efficiency against this GPU's dense bf16 GEMM rate measured in the same run; each
           shape timed two ways side by side: one call between CUDA events (`seconds`: the eager launch, its
           host-side gap before the kernel included, as training and prefill issue it) and GRAPH_CALLS calls
           replayed in one CUDA graph (`graph_seconds`, per call: how SGLang's decode and verify issue it)
  block    transformers' sparse MoE block forward (router, top-k, sort, grouped GEMMs, combine) per
           `experts_implementation` and token count, with the CUDA kernels it launches counted
  forward  a Qwen3-30B-A3B-shaped target forward (published config, random bf16 weights, N layers, 3,072
           tokens, no grad: the trainer's target forward) per `experts_implementation`

Every figure is a measurement of this machine; none is fitted to a planner row.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks.device_ceilings import cuda_median_s as timed

RESULT = Path(__file__).resolve().parent / "results" / "moe_layer.json"
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
IMPLEMENTATIONS = ["grouped_mm", "batched_mm", "eager"]
GRAPH_CALLS = 20


def dense_peak(size: int = 8192) -> float:
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    return 2 * size**3 / timed(lambda: a @ b)


def kernel_floors(kernels: int = 1000) -> dict[str, float]:
    x = torch.zeros(1, device="cuda")

    def launch() -> None:
        for _ in range(kernels):
            x.add_(1)

    eager = timed(launch, runs=10) / kernels
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launch()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    replay = timed(graph.replay, runs=10) / kernels
    return {"eager_s": eager, "graph_s": replay, "kernels": kernels}


def moe_targets() -> list[Any]:
    from dflashx.targets.registry import REGISTRY

    return [f for f in REGISTRY.values() if f.is_moe]


def routed_offsets(tokens: int, experts: int, top_k: int, seed: int = 0) -> tuple[torch.Tensor, int, float]:
    """Offsets of `tokens` x top-k rows routed uniformly at random (k distinct experts per token), the experts
    touched and the mean rows per touched expert."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    scores = torch.rand(tokens, experts, device="cuda", generator=g)
    ids = scores.topk(top_k, dim=-1).indices.reshape(-1)
    counts = torch.bincount(ids, minlength=experts)
    touched = int((counts > 0).sum())
    return torch.cumsum(counts, 0).to(torch.int32), touched, tokens * top_k / touched


def grouped_rows(peak: float, tokens_list: list[int]) -> list[dict[str, Any]]:
    rows = []
    seen = set()
    for facts in moe_targets():
        e, k, h, i = facts.num_experts, facts.num_experts_per_tok, facts.hidden_size, facts.moe_intermediate_size
        if (e, k, h, i) in seen:
            continue
        seen.add((e, k, h, i))
        weights = {"gate_up": torch.randn(e, 2 * i, h, device="cuda", dtype=torch.bfloat16),
                   "down": torch.randn(e, h, i, device="cuda", dtype=torch.bfloat16)}
        for tokens in tokens_list:
            offs, touched, per_expert = routed_offsets(tokens, e, k)
            for proj, w in weights.items():
                n_out, n_in = w.shape[1], w.shape[2]
                x = torch.randn(tokens * k, n_in, device="cuda", dtype=torch.bfloat16)
                wt = w.transpose(-2, -1)
                def call(x: torch.Tensor = x, wt: torch.Tensor = wt, offs: torch.Tensor = offs) -> torch.Tensor:
                    return torch._grouped_mm(x, wt, offs=offs)

                def calls(call: Callable[[], torch.Tensor] = call) -> None:
                    for _ in range(GRAPH_CALLS):
                        call()

                seconds = timed(call)
                graph_seconds = timed(graphed(calls), runs=10) / GRAPH_CALLS
                flops = 2 * tokens * k * n_in * n_out
                rows.append({"target": facts.name, "experts": e, "top_k": k, "proj": proj, "in": n_in,
                             "out": n_out, "tokens": tokens, "touched": touched, "rows_per_expert": per_expert,
                             "seconds": seconds, "graph_seconds": graph_seconds, "tflops": flops / seconds / 1e12,
                             "efficiency": flops / seconds / peak,
                             "weight_read_tbps": touched * n_in * n_out * 2 / seconds / 1e12})
                r = rows[-1]
                print(f"{facts.name:24} {proj:8} {tokens:6} {touched:4} {per_expert:8.1f} {seconds * 1e6:9.1f} "
                      f"{graph_seconds * 1e6:9.1f} {r['tflops']:7.1f} {r['efficiency']:6.3f} "
                      f"{r['weight_read_tbps']:6.2f}", flush=True)
        del weights
        torch.cuda.empty_cache()
    return rows


def moe_block(kind: str, impl: str) -> tuple[torch.nn.Module, Any]:
    """A transformers sparse MoE block at a registered target's published shape, random bf16 weights."""
    if kind == "qwen3_moe":
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock as Block

        config = Qwen3MoeConfig(hidden_size=2048, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                                norm_topk_prob=True)
    else:
        from transformers.models.qwen3_5_moe import Qwen3_5MoeTextConfig
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeSparseMoeBlock as Block

        config = Qwen3_5MoeTextConfig(hidden_size=2048, moe_intermediate_size=512, num_experts=256,
                                      num_experts_per_tok=8, shared_expert_intermediate_size=512)
    config._experts_implementation = impl
    with torch.device("cuda"):
        block = Block(config).to(torch.bfloat16)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.02)  # the router's zeros would send every token to the same experts
    return block.eval().requires_grad_(False), config


def count_kernels(fn: Callable[[], Any]) -> int:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def graphed(fn: Callable[[], Any]) -> Callable[[], Any]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def block_rows(tokens_list: list[int]) -> list[dict[str, Any]]:
    rows = []
    for kind in ("qwen3_moe", "qwen3_5_moe"):
        for impl in IMPLEMENTATIONS:
            block, config = moe_block(kind, impl)
            for tokens in tokens_list:
                pairs = tokens * config.num_experts_per_tok
                # batched_mm gathers one weight copy per (token, expert) pair: cap it where that passes 24 GB
                if impl == "batched_mm" and pairs * 3 * 2048 * config.moe_intermediate_size * 2 > 24e9:
                    continue
                if impl == "eager" and tokens > 8192:
                    continue
                x = torch.randn(1, tokens, 2048, device="cuda", dtype=torch.bfloat16)
                row: dict[str, Any] = {"block": kind, "impl": impl, "tokens": tokens}
                try:
                    def forward(block: torch.nn.Module = block, x: torch.Tensor = x) -> torch.Tensor:
                        return block(x)

                    row["eager_s"] = timed(forward, runs=10)
                    row["kernels"] = count_kernels(forward)
                    if impl == "grouped_mm" and tokens <= 512:
                        row["graph_s"] = timed(graphed(forward), runs=10)
                except Exception as error:  # noqa: BLE001 - a row that cannot run is reported, not fatal
                    row["error"] = f"{type(error).__name__}: {str(error)[:160]}"
                rows.append(row)
                graph = f"{row['graph_s'] * 1e6:9.1f}" if "graph_s" in row else " " * 9
                took = f"{row['eager_s'] * 1e6:10.1f}" if "eager_s" in row else row.get("error", "")[:40]
                print(f"{kind:12} {impl:11} {tokens:6} {took} {graph} {row.get('kernels', '')}", flush=True)
            del block
            torch.cuda.empty_cache()
    return rows


def forward_rows(layers: int, seq: int) -> list[dict[str, Any]]:
    from benchmarks.step_parts import build_target
    from benchmarks.train_step import SHAPES

    shape = SHAPES["qwen3-30b-a3b-moe"]
    target = build_target(shape, layers, "cuda", torch.bfloat16)
    for p in target.parameters():
        torch.nn.init.normal_(p, std=0.02)
    ids = torch.randint(0, shape["vocab_size"], (1, seq), device="cuda")
    rows = []
    for impl in IMPLEMENTATIONS:
        if hasattr(target, "set_experts_implementation"):
            target.set_experts_implementation(impl)
        else:
            target.config._experts_implementation = impl
        row: dict[str, Any] = {"shape": "qwen3-30b-a3b-moe", "layers": layers, "seq": seq, "impl": impl}
        try:
            torch.cuda.reset_peak_memory_stats()
            with torch.no_grad():
                row["seconds"] = timed(lambda: target.model(input_ids=ids, use_cache=False), runs=5, warmup=2)
            row["per_layer_s"] = row["seconds"] / layers
            row["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 1e9
        except Exception as error:  # noqa: BLE001 - an implementation that cannot run is reported
            row["error"] = f"{type(error).__name__}: {str(error)[:160]}"
            torch.cuda.empty_cache()
        rows.append(row)
        took = f"{row['seconds'] * 1e3:8.1f} ms" if "seconds" in row else row["error"][:60]
        print(f"forward {impl:11} {layers} layers x {seq} tokens: {took}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", default=["floors", "grouped", "block", "forward"])
    p.add_argument("--tokens", type=int, nargs="+", default=TOKENS)
    p.add_argument("--forward-layers", type=int, default=8)
    p.add_argument("--seq", type=int, default=3072)
    p.add_argument("--out", type=Path, default=RESULT)
    args = p.parse_args(argv)
    import transformers

    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "transformers": transformers.__version__, "python": sys.version.split()[0]}

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")

    result["dense_bf16_flops"] = dense_peak()
    print(f"{result['device']}: dense bf16 GEMM {result['dense_bf16_flops'] / 1e12:.0f} TFLOP/s", flush=True)
    if "floors" in args.parts:
        result["floors"] = kernel_floors()
        print(f"kernel floor: eager {result['floors']['eager_s'] * 1e6:.2f} us, "
              f"graph {result['floors']['graph_s'] * 1e6:.2f} us", flush=True)
        save()
    if "grouped" in args.parts:
        print(f"{'target':24} {'proj':8} {'tokens':>6} {'exp':>4} {'rows/e':>8} {'us':>9} {'graph us':>9} "
              f"{'TFLOP/s':>7} "
              f"{'eff':>6} {'TB/s':>6}")
        result["grouped"] = grouped_rows(result["dense_bf16_flops"], args.tokens)
        save()
    if "block" in args.parts:
        result["block"] = block_rows(args.tokens)
        save()
    if "forward" in args.parts:
        result["forward"] = forward_rows(args.forward_layers, args.seq)
        save()
    return result


if __name__ == "__main__":
    main()
