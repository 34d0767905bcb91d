"""What a dense weight GEMM costs on this GPU at the token counts decode and a speculative verify give it.

Usage (on a GPU machine): python -m benchmarks.dense_gemm [--out PATH]
Writes benchmarks/results/dense_gemm.json. For each projection of the registered dense targets (SHAPES:
qkv h -> q + 2 kv, o q -> h, gate_up h -> 2 i, down i -> h, the LM head h -> V; config.json facts, kept equal
to dflashx/targets/registry.py by tests/test_plan_verify.py) and each token count M, `x[M, in] @ W[out, in]^T`
in bf16 (torch.nn.functional.linear: cuBLAS, the engines' dense path) is timed replayed in a CUDA graph (how
SGLang and vLLM run decode and verify), cycling over enough weight copies that no call finds its weights in
L2 (a forward's layers each read their own). The same run measures the dense 8192^3 bf16 GEMM rate and the
copy bandwidth, the references `benchmarks.verify_constants` reduces against. A measurement of this machine;
nothing here is fitted to a planner row.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

RESULT = Path(__file__).resolve().parent / "results" / "dense_gemm.json"
TOKENS = [1, 4, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 4096]
# (target, hidden, q width, kv width, FFN, vocab): each model's config.json (tests check the registry agrees)
SHAPES = [("meta-llama/Llama-3.1-8B-Instruct", 4096, 4096, 1024, 14336, 128256),
          ("Qwen/Qwen3-8B", 4096, 4096, 1024, 12288, 151936),
          ("Qwen/Qwen3-32B", 5120, 8192, 1024, 25600, 151936),
          ("Qwen/Qwen3.6-27B", 5120, 6144, 1024, 17408, 248320)]
CALLS, L2_BYTES = 16, 256e6


def projections(h: int, q: int, kv: int, ffn: int, vocab: int) -> dict[str, tuple[int, int]]:
    return {"qkv": (h, q + 2 * kv), "o": (q, h), "gate_up": (h, 2 * ffn), "down": (ffn, h), "head": (h, vocab)}


def graph_seconds(fn, calls: int = CALLS) -> float:
    """Per call: `calls` calls of `fn` captured in one CUDA graph, replayed (median of 10, 3 warm-ups)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(calls):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    times = []
    for run in range(13):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        if run >= 3:
            times.append(start.elapsed_time(end) / 1e3 / calls)
    return sorted(times)[len(times) // 2]


def references() -> dict[str, float]:
    """The dense 8192^3 bf16 rate and the copy bandwidth (bytes read + written) of this run."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    flops = 2 * 8192**3 / graph_seconds(lambda i: a @ a, 4)
    src = torch.empty(2**32, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = 2 * src.numel() / graph_seconds(lambda i: dst.copy_(src), 4)
    return {"dense_bf16_flops": flops, "copy_bytes_per_s": copy}


def shape_rows(target: str, proj: str, n_in: int, n_out: int) -> list[dict[str, object]]:
    copies = max(2, int(L2_BYTES // (n_in * n_out * 2)) + 1)
    weights = [torch.randn(n_out, n_in, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    rows = []
    for m in TOKENS:
        x = torch.randn(m, n_in, device="cuda", dtype=torch.bfloat16)
        seconds = graph_seconds(lambda i, x=x: torch.nn.functional.linear(x, weights[i % copies]))
        rows.append({"target": target, "proj": proj, "in": n_in, "out": n_out, "tokens": m, "seconds": seconds,
                     "weight_bytes": n_in * n_out * 2, "flops": 2 * m * n_in * n_out})
    return rows


def main(argv: list[str] | None = None) -> None:
    out = Path(argv[0]) if argv else RESULT
    result: dict[str, object] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                 "calls_per_graph": CALLS, **references(), "rows": []}
    seen = set()
    for target, h, q, kv, ffn, vocab in SHAPES:
        for proj, (n_in, n_out) in projections(h, q, kv, ffn, vocab).items():
            if (n_in, n_out) not in seen:
                seen.add((n_in, n_out))
                result["rows"] += shape_rows(target, proj, n_in, n_out)  # type: ignore[operator]
                torch.cuda.empty_cache()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
