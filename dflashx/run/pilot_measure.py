"""What a pilot's records say: length statistics of its completions and the trainer's windows.

Lengths: `usage.completion_tokens` of each completion (what the backend counted), a histogram of
them (`HistogramLengths.histogram`, those stopped at max_tokens as its open tail), and the standard
error of the mean, post-stratified by source: se^2 = sum over sources of w_s^2 sd_s^2 / n_s with
w_s each source's share of the ingested prompts (a source the pilot did not reach counts as one
sample at the pooled spread). Training: the windows of `train/logs/metrics.jsonl` after the first
(compilation, data loading and the first allocations land in it), their median MFU and the
relative standard error of their mean.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from dflashx.data.jsonl import dumps
from dflashx.plan.estimates.lengths import HistogramLengths


def source_weights(prompts: Iterable[dict[str, Any]]) -> tuple[dict[str, float], int, float]:
    """(share of each source, prompt count, mean bytes of a prompt record) of the ingested prompts."""
    counts: Counter[str] = Counter()
    size = 0
    for p in prompts:
        counts[p.get("source", "")] += 1
        size += len(dumps(p).encode()) + 1  # the JSONL line and its newline
    n = sum(counts.values())
    return {s: c / n for s, c in counts.items()} if n else {}, n, size / n if n else 0.0


def _stratified_se(by_source: dict[str, list[float]], weights: dict[str, float], pooled_sd: float) -> float:
    var = 0.0
    for source, w in weights.items():
        xs = by_source.get(source, [])
        sd = statistics.stdev(xs) if len(xs) > 1 else pooled_sd
        var += w * w * sd * sd / max(len(xs), 1)
    return math.sqrt(var)


def slim(record: dict[str, Any]) -> dict[str, Any]:
    """What the measurements read of a completion record (the texts only by their size)."""
    text = len((record.get("reasoning") or "").encode()) + len((record.get("answer") or "").encode())
    return {"id": record["id"], "source": record.get("source", ""), "usage": record["usage"],
            "finish_reason": record.get("finish_reason"), "text_bytes": text}


def length_stats(completions: list[dict[str, Any]], weights: dict[str, float], max_tokens: int,
                 max_length: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(`dataset.stats` fields measured, figures for the report) of these (`slim`) completion records."""
    outputs = [float(r["usage"]["completion_tokens"]) for r in completions]
    prompts = [float(r["usage"]["prompt_tokens"]) for r in completions]
    n = len(outputs)
    by_source: dict[str, list[float]] = defaultdict(list)
    for r, x in zip(completions, outputs):
        by_source[r.get("source", "")].append(x)
    pooled = statistics.stdev(outputs) if n > 1 else 0.0
    se = _stratified_se(by_source, weights or {"": 1.0}, pooled)
    text = sum(r["text_bytes"] for r in completions)
    mean = statistics.fmean(outputs)
    truncated = sum(r.get("finish_reason") == "length" for r in completions)
    cut = [float(max_tokens) if r.get("finish_reason") == "length" else x for r, x in zip(completions, outputs)]
    hist = HistogramLengths.histogram(cut, cut_at=max_tokens)  # a completion stopped by max_tokens is the open tail
    stats = {
        "prompt_tokens_mean": statistics.fmean(prompts),
        "output_tokens_mean": mean,
        "output_tokens_p90": HistogramLengths.of(hist).quantile(0.9),
        "output_tokens_histogram": hist.model_dump(),
        "output_tokens_mean_se": se,
    }
    if sum(outputs):
        stats["output_bytes_per_token"] = text / sum(outputs)
    report = {
        "completions": n, "output_tokens_mean": mean, "output_tokens_sd": pooled, "output_tokens_mean_se": se,
        "output_tokens_p90": stats["output_tokens_p90"], "prompt_tokens_mean": stats["prompt_tokens_mean"],
        "truncated_share": truncated / n, "truncated": truncated,
        "train_cut_share": sum(p + o > max_length for p, o in zip(prompts, outputs)) / n,
        "per_source": {s: {"n": len(xs), "mean": statistics.fmean(xs), "weight": weights.get(s, 0.0)}
                       for s, xs in sorted(by_source.items())},
    }
    return stats, report


def training_stats(windows: list[dict[str, Any]], world: int,
                   probes: Sequence[dict[str, Any]] = ()) -> dict[str, Any] | None:
    """The trainer's figures over its logged windows (the first left out when there are more), and the median
    seconds of its held-out τ measurements (`probes`, its τ lines; the first left out when there are more: it
    pays the decoder's first use)."""
    used = windows[1:] if len(windows) > 1 else windows
    used = [w for w in used if w.get("mfu")]
    if not used:
        return None
    mfu = [float(w["mfu"]) for w in used]
    mean = statistics.fmean(mfu)
    rse = statistics.stdev(mfu) / mean / math.sqrt(len(mfu)) if len(mfu) > 1 and mean else None
    step_s = [w["flops_per_step"] / (w["tflops"] * 1e12) for w in used if w.get("tflops")]
    return {"mfu": statistics.median(mfu), "mfu_rse": rse, "windows": len(used), "steps": windows[-1].get("step"),
            "tokens_per_s_per_gpu": statistics.median(w["tokens_per_s"] for w in used) / world,
            "tflops_per_gpu": statistics.median(w["tflops"] for w in used) / world,
            "step_s": statistics.median(step_s) if step_s else None,
            "tau_probe_s": probe_seconds(probes), "decode_cycle_s": cycle_seconds(probes)}


def _timed(probes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The held-out τ measurements that were timed, the first left out when there are more (it pays the decoder's
    first use)."""
    return [p for p in (probes[1:] if len(probes) > 1 else probes) if p.get("heldout_seconds")]


def probe_seconds(probes: Sequence[dict[str, Any]]) -> float | None:
    """The median seconds of the held-out τ measurements."""
    seconds = [float(p["heldout_seconds"]) for p in _timed(probes)]
    return statistics.median(seconds) if seconds else None


def cycle_seconds(probes: Sequence[dict[str, Any]]) -> float | None:
    """The median seconds of one batched draft-verify cycle in the held-out τ measurements (each measurement's
    seconds over its `heldout_decode_cycles`, the prefill included): what a batched decode on this node costs per
    cycle, whatever its rows, while it is launch-bound."""
    per = [float(p["heldout_seconds"]) / int(p["heldout_decode_cycles"]) for p in _timed(probes)
           if p.get("heldout_decode_cycles")]
    return statistics.median(per) if per else None
