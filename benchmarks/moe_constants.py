"""The constants of dflashx/plan/estimates/moe.py, reduced from benchmarks/results/moe_layer.json (no torch).

Usage: python -m benchmarks.moe_constants    prints them; tests/test_plan_moe_layer.py checks moe.py against them.
  read share, fixed: least squares of grouped-GEMM time on the touched experts' weight bytes, rows per expert <= 64
  efficiency(r):     median over targets and projections of FLOPs / ((time - fixed) x the run's dense bf16 rate),
                     rows within a factor sqrt(2) of r, r = 64 ... 2048
  floors:            the `floors` part as measured
  transformers row bytes: slope of (block eager time - its two grouped GEMMs) on routed rows, 1,024+ tokens, at
                     the copy rate (0.884 x 4.8 TB/s), per hidden element, mean of the two blocks
  graph fixed:       the same least squares on benchmarks/results/moe_grouped_graph.json (one H100), where every
                     shape was timed eagerly and replayed in a CUDA graph side by side: the graph intercept (and,
                     for comparison, that run's eager intercept and both read rates)
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

RESULT = Path(__file__).resolve().parent / "results" / "moe_layer.json"
GRAPH_RESULT = RESULT.with_name("moe_grouped_graph.json")
H200_TBPS, COPY_SHARE, HIDDEN = 4.8, 0.884, 2048
BLOCK_TARGETS = {"qwen3_moe": "Qwen/Qwen3-30B-A3B", "qwen3_5_moe": "Qwen/Qwen3.6-35B-A3B"}


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def _memory_fit(grouped: list[dict[str, Any]], key: str) -> tuple[float, float]:
    """(intercept s, seconds per weight byte) of grouped-GEMM time `key` where rows per expert <= 64."""
    memory = [r for r in grouped if r["rows_per_expert"] <= 64]
    return _line([r["touched"] * r["in"] * r["out"] * 2 for r in memory], [r[key] for r in memory])


def derive_graph(result: dict[str, Any]) -> dict[str, Any]:
    """The graph-replayed and eager intercepts and read rates (TB/s) of one side-by-side run."""
    (eager, eager_per_byte), (graph, graph_per_byte) = (_memory_fit(result["grouped"], key)
                                                        for key in ("seconds", "graph_seconds"))
    return {"graph_fixed_s": graph, "eager_fixed_s": eager, "graph_read_tbps": 1 / graph_per_byte / 1e12,
            "eager_read_tbps": 1 / eager_per_byte / 1e12, "device": result["device"]}


def derive(result: dict[str, Any]) -> dict[str, Any]:
    grouped, dense = result["grouped"], result["dense_bf16_flops"]
    fixed, per_byte = _memory_fit(grouped, "seconds")
    efficiency = {}
    for p in range(6, 12):
        near = [r for r in grouped if abs(math.log2(r["rows_per_expert"]) - p) < 0.5]
        efficiency[2**p] = statistics.median(2 * r["tokens"] * r["top_k"] * r["in"] * r["out"]
                                             / ((r["seconds"] - fixed) * dense) for r in near)
    row_bytes = []
    for block, target in BLOCK_TARGETS.items():
        xs, ys = [], []
        for b in result["block"]:
            if b["block"] == block and b["impl"] == "grouped_mm" and b["tokens"] >= 1024:
                gemms = sum(r["seconds"] for r in grouped if r["target"] == target and r["tokens"] == b["tokens"])
                xs.append(b["tokens"] * 8)
                ys.append(b["eager_s"] - gemms)
        row_bytes.append(_line(xs, ys)[1] * H200_TBPS * 1e12 * COPY_SHARE / HIDDEN)
    return {"read_share": 1 / per_byte / (H200_TBPS * 1e12), "fixed_s": fixed, "efficiency": efficiency,
            "graph_floor_s": result["floors"]["graph_s"], "eager_floor_s": result["floors"]["eager_s"],
            "transformers_row_bytes_per_hidden": statistics.fmean(row_bytes)}


def main() -> None:
    print(json.dumps(derive(json.loads(RESULT.read_text())), indent=1))
    print(json.dumps(derive_graph(json.loads(GRAPH_RESULT.read_text())), indent=1))


if __name__ == "__main__":
    main()
