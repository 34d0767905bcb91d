"""Acceptance statistics over many decoded prompts, and their plot.

tau (the mean acceptance length) is the mean over all cycles of (accepted drafts + 1): the tokens
one target forward yields. Acceptance at draft position k (1..B-1) is the share of cycles that
drafted position k and accepted it; as the accepted prefix must be contiguous, it falls with k.

Public API: `summarize(results, block_size) -> dict` (JSON-ready), `plot_acceptance(
summaries: dict[str, dict], path)` (PNG, matplotlib Agg).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dflashx.dflash.spec_decode import DecodeResult
from dflashx.store.atomic import atomic_path


def summarize(results: Sequence[DecodeResult], block_size: int) -> dict[str, Any]:
    """tau, acceptance per draft position, accepted-length histogram and throughput of a set of runs."""
    accepted = [a for r in results for a in r.accepted]
    drafted = [d for r in results for d in r.drafted]
    positions = range(1, block_size)
    offered = [sum(d >= k for d in drafted) for k in positions]
    hits = [sum(a >= k for a in accepted) for k in positions]
    tokens = sum(len(r.output_ids) for r in results)
    seconds = sum(r.seconds for r in results)
    return {
        "tau": sum(a + 1 for a in accepted) / len(accepted) if accepted else 0.0,
        "acceptance_by_position": [h / o if o else None for h, o in zip(hits, offered)],
        "accept_length_histogram": [sum(a == n for a in accepted) for n in range(block_size)],
        "cycles": len(accepted),
        "prompts": len(results),
        "generated_tokens": tokens,
        "target_forwards": sum(r.target_forwards for r in results),
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else None,
    }


def plot_acceptance(summaries: dict[str, dict[str, Any]], path: str | Path) -> Path:
    """Acceptance per draft position (left) and the accepted-length histogram (right), one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    path = Path(path)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name, s in summaries.items():
        acc = s["acceptance_by_position"]
        xs = [k + 1 for k, v in enumerate(acc) if v is not None]
        left.plot(xs, [v for v in acc if v is not None], marker="o", label=f"{name} (tau {s['tau']:.2f})")
        hist = s["accept_length_histogram"]
        total = sum(hist) or 1
        right.plot(range(len(hist)), [h / total for h in hist], marker="o", label=name)
    left.set(xlabel="draft position k", ylabel="P(position k accepted)", ylim=(0, 1.02), title="Acceptance per position")
    right.set(xlabel="accepted drafts per cycle", ylabel="share of cycles", title="Accepted length")
    for ax in (left, right):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None}, dpi=110)
    plt.close(fig)
    return path
