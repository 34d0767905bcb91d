"""The data-recipe ablation of benchmarks/drafter_quality.py (`--ablation data`): what to train on for a
drafter served at temperature > 0.

Cells: the tiny target's data generated at temperature 0 (greedy) or 0.6 (top_p 0.95, as Qwen serves thinking)
x the labels the drafter learns (`data`: the generated tokens; `target`: the target's greedy next token at each
position), `--seeds` seeds each; every drafter is evaluated on the same 16 held-out prompts greedily and at
temperature 0.6 (rejection sampling, `SAMPLE_SEEDS` sampling seeds per prompt set; τ as the reference counts it).
Before training it measures how far the 0.6 data is from the greedy data (same prompts): completions identical,
and the tokens agreeing with the greedy completion before the first difference.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.quality_parts import REPO, SAMPLE_SEEDS, prepare

RESULT = REPO / "benchmarks" / "results" / "drafter_data.json"
TEMPERATURES = (0.0, 0.6)
SERVED = 0.6  # the temperature the sampled τ is measured at (Qwen's for thinking)
TOP_P = 0.95
LABELS = ("data", "target")
RunAll = Callable[[Path, dict[str, dict[str, Any]], Any, int], list[dict[str, Any]]]
Summarize = Callable[[list[dict[str, Any]], list[str]], list[dict[str, Any]]]


def generation(temperature: float) -> dict[str, Any]:
    """The generate-stage overrides of a cell's data."""
    return {"stages.generate.temperature": temperature, "stages.generate.top_p": TOP_P if temperature else 1.0}


def prep_root(root: Path, temperature: float) -> Path:
    return root / f"data-t{temperature:g}"


def data_variants() -> dict[str, dict[str, Any]]:
    """name -> overrides; `prep` names the tokenized data the cell trains on (not a recipe key)."""
    return {f"gen T{t:g} + labels {labels}": {"labels": labels, "prep": f"{t:g}"}
            for t in TEMPERATURES for labels in LABELS}


def _completions(run: Path) -> dict[str, list[str]]:
    from dflashx.data.jsonl import iter_shards

    out = {}
    for record in iter_shards(run / "tiny" / "generate" / "completions"):
        out[str(record["id"])] = f"{record.get('reasoning') or ''} {record.get('answer') or ''}".split()
    return out


def divergence(root: Path) -> dict[str, Any]:
    """How far the 0.6 completions are from the greedy ones, per prompt (whitespace words)."""
    greedy, sampled = (_completions(prep_root(root, t) / "prep") for t in TEMPERATURES)
    same = [k for k in greedy if k in sampled]
    agree = []
    for k in same:
        a, b = greedy[k], sampled[k]
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        agree.append(n / max(1, len(a)))
    return {"prompts": len(same), "identical": sum(greedy[k] == sampled[k] for k in same) / max(1, len(same)),
            "greedy_prefix_share_mean": statistics.mean(agree) if agree else None,
            "words_mean": {"greedy": statistics.mean(len(greedy[k]) for k in same),
                           "sampled": statistics.mean(len(sampled[k]) for k in same)}}


def prepare_all(root: Path) -> dict[str, dict[str, Path]]:
    """The tiny pipeline up to tokenize once per generation temperature."""
    return {f"{t:g}": prepare(prep_root(root, t), [f"{k}={v}" for k, v in generation(t).items()])
            for t in TEMPERATURES}


def run(root: Path, seeds: int, jobs: int, run_all: RunAll, summarize: Summarize,
        printer: Callable[[list[dict[str, Any]]], None]) -> dict[str, Any]:
    prepare_all(root)
    diff = divergence(root)
    print(f"0.6 vs greedy data: {diff['identical']:.0%} of {diff['prompts']} completions identical, "
          f"{diff['greedy_prefix_share_mean']:.0%} of a greedy completion agrees before the first difference")
    grid = data_variants()
    rows = run_all(root, grid, seeds, jobs)
    table = summarize(rows, list(grid))
    for t in table:
        sampled = [r["tau_sampled"] for r in rows if r["variant"] == t["variant"]]
        t["tau_sampled_mean"], t["tau_sampled_sd"] = statistics.mean(sampled), statistics.stdev(sampled)
    printer(table)
    print(f"\n{'variant':<46} {'τ@0.6 mean ± sd':>16}")
    for t in table:
        print(f"{t['variant']:<46} {t['tau_sampled_mean']:>8.3f} ± {t['tau_sampled_sd']:.3f}")
    result = {
        "recipe": "recipes/tiny.yaml", "seeds": seeds, "jobs": jobs, "cpu_count": os.cpu_count(),
        "eval": f"16 held-out prompts, 96 new tokens: greedy, and at temperature 0.6 (rejection sampling, "
                f"{SAMPLE_SEEDS} sampling seeds averaged per drafter); τ = tokens after the prefill's first / cycles",
        "data_divergence": diff, "table": table, "rows": rows,
    }
    RESULT.write_text(json.dumps(result, indent=1) + "\n")
    return result
