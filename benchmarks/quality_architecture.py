"""The architecture ablation of benchmarks/drafter_quality.py (`--ablation architecture`): DFlash
against DFlash2 on the tiny recipe.

- A, equal optimizer steps: DFlash and DFlash2 (both policies for a label outside the selector's
  top-k: `skip`, `swap`) at blocks 8 and 16, the tiny recipe's 10 epochs, `--seeds` seeds each.
- B, equal time: DFlash trained for as long as the best DFlash2 variant of its block took (its epochs
  scaled by the two variants' measured seconds per step in A), so the comparison also holds per
  second of training.
- C, long: DFlash and both DFlash2 variants at block 8 with `LONG_FACTOR` x the epochs (NeMo saw the
  selector's gain over the backbone's top-1 appear only after ~300 steps; the tiny run has ~320),
  `--long-seeds` seeds each, run beside A.
Every variant trains on the same tokenized data and is evaluated on the same 16 held-out prompts,
greedy, 96 new tokens, τ as the reference counts it (quality_parts.run_one).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.quality_parts import BLOCKS, LONG_FACTOR, REPO, architecture_variants

RESULT = REPO / "benchmarks" / "results" / "drafter_architecture.json"
RunAll = Callable[[Path, dict[str, dict[str, Any]], Any, int], list[dict[str, Any]]]
Summarize = Callable[[list[dict[str, Any]], list[str]], list[dict[str, Any]]]


def _best(table: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    return max((t for t in table if t["variant"].startswith(prefix)), key=lambda t: t["tau_mean"])


def equal_time_variants(table: list[dict[str, Any]], epochs: float) -> dict[str, dict[str, Any]]:
    """B: per block, DFlash for as long as that block's best DFlash2 variant trained (seconds per step
    measured in A, same seeds and machine)."""
    out = {}
    for block in BLOCKS:
        d2, d1 = _best(table, f"dflash2 b{block} "), _best(table, f"dflash b{block}")
        ratio = d2["s_per_step_mean"] / d1["s_per_step_mean"]
        out[f"dflash b{block} equal time ({d2['variant']})"] = d1["train"] | {"epochs": round(epochs * ratio, 3)}
    return out


def long_variants(epochs: float) -> dict[str, dict[str, Any]]:
    """C: DFlash and both DFlash2 variants at block 8, LONG_FACTOR x the epochs (chosen before A, so that
    C runs beside A)."""
    grid = architecture_variants()
    return {f"{name} x{LONG_FACTOR} epochs": grid[name] | {"epochs": epochs * LONG_FACTOR}
            for name in grid if name.startswith(("dflash b8", "dflash2 b8 "))}


def run(root: Path, seeds: int, long_seeds: int, jobs: int, run_all: RunAll, summarize: Summarize,
        printer: Callable[[list[dict[str, Any]]], None]) -> dict[str, Any]:
    """A, then B and C from A's measurements; writes RESULT and returns it."""
    from dflashx.config.load import load_recipe

    epochs = load_recipe(REPO / "recipes" / "tiny.yaml").recipe.stages.train.epochs
    grid, long = architecture_variants(), long_variants(epochs)
    rows = run_all(root, grid | long, dict.fromkeys(grid, seeds) | dict.fromkeys(long, long_seeds), jobs)
    stage_a = summarize(rows, list(grid))
    equal_time = equal_time_variants(stage_a, epochs)
    rows += run_all(root, equal_time, seeds, jobs)
    table = stage_a + summarize(rows, list(equal_time)) + summarize(rows, list(long))
    printer(table)
    result = {
        "recipe": "recipes/tiny.yaml", "seeds": seeds, "long_seeds": long_seeds, "jobs": jobs,
        "cpu_count": os.cpu_count(),
        "eval": "16 held-out prompts, greedy, 96 new tokens, τ = tokens after the prefill's first / cycles",
        "best_dflash2_b8": _best(stage_a, "dflash2 b8 ")["variant"], "best_b8": _best(stage_a, "")["variant"],
        "stages": {"equal_steps": list(grid), "equal_time": list(equal_time), "long": list(long)},
        "table": table, "rows": rows,
    }
    RESULT.write_text(json.dumps(result, indent=1) + "\n")
    return result
