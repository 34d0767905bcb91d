"""The dense GEMM efficiency table of dflashx/plan/estimates/gemm.py, reduced from benchmarks/results/dense_gemm.json
(no torch).

Usage: python -m benchmarks.verify_constants    prints (rows, efficiency) pairs for `DENSE_EFFICIENCY`.
  efficiency(M) = median over the measured projections of FLOPs / (time x the run's dense 8,192^3 rate), over the
  shapes whose time at M rows is at least COMPUTE_SIGN x their time at one row (the weight read alone): below
  that the GEMM reads at its memory-bound rate and its efficiency is not observable (gemm.py holds the table's
  first value there, where the memory term binds), as moe_constants.py does for the grouped GEMM.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

RESULT = Path(__file__).resolve().parent / "results" / "dense_gemm.json"
COMPUTE_SIGN = 1.25


def derive(result: dict[str, Any]) -> list[tuple[int, float]]:
    """(rows, efficiency) where at least one projection is compute-influenced at that row count."""
    rows, dense = result["rows"], result["dense_bf16_flops"]
    one = {(r["in"], r["out"]): r["seconds"] for r in rows if r["tokens"] == 1}
    table = []
    for m in sorted({r["tokens"] for r in rows}):
        seen = [r["flops"] / (r["seconds"] * dense) for r in rows
                if r["tokens"] == m and r["seconds"] >= COMPUTE_SIGN * one[(r["in"], r["out"])]]
        if seen:
            table.append((m, round(statistics.median(seen), 3)))
    return table


def main() -> None:
    result = json.loads(RESULT.read_text())
    print(f"{result['device']}: dense bf16 {result['dense_bf16_flops'] / 1e12:.0f} TFLOP/s, copy "
          f"{result['copy_bytes_per_s'] / 1e12:.2f} TB/s")
    print("DENSE_EFFICIENCY =", tuple(derive(result)))


if __name__ == "__main__":
    main()
