"""Acceptance statistics over many decoded prompts, and their plot.

tau (the mean acceptance length) is counted as the reference DFlash loop counts it (PyPI `dflash`
0.1.0, `dflash_generate`): the tokens decoded after the prefill's first token, divided by the
draft-verify cycles, pooled over the prompts (a cycle cut short by a stop token or by
max_new_tokens counts only the tokens it kept). `accepted_plus_one` keeps the older figure, the
mean of (accepted drafts + 1) over all cycles, which counts such a cut cycle whole. Acceptance at draft position k
(1..B-1) is the share of cycles that
drafted position k and accepted it; as the accepted prefix must be contiguous, it falls with k.

Groups (per prompt source, per context-length bucket) are summarized exactly like the whole set:
a group's tau is its prompts' decoded tokens over all their cycles, so a group with
long prompts weighs by its cycles, not by its prompt count.

At the serving temperature (rejection sampling) tau varies with the sampler's draws, so the eval
decodes the prompts once per seed: `sampled_summary` gives tau per seed (each pooled as above), their
mean and its standard error over the seeds (sample standard deviation / sqrt(seeds)), the 95%
interval mean +- t SE (t: Student's 97.5% quantile at seeds - 1 degrees of freedom, `t975`: 2.776 at
the default 5 seeds, 12.706 at 2; the normal 1.96 would cover about 88% of the time at 5 seeds and
70% at 2), and acceptance by position and the histogram pooled over every seed's
cycles (what the serving prediction reads). The interval covers the sampler's variation on these
prompts, not the choice of prompts.

Context-length buckets are by the prompt's length in tokens (chat template applied), the context
the drafter starts from: `<512`, `512-2K`, `2K-8K`, `8K-32K`, `>=32K` (K = 1024).

Public API: `summarize(results, block_size) -> dict` (JSON-ready), `summarize_groups(results,
labels, block_size, order=None) -> {label: summary}`, `drafter_summary(results, block_size,
sources, buckets)` (one drafter's eval.json entry on one suite), `sampled_summary(results_per_seed,
block_size)`, `t975(df)`, `context_bucket(prompt_tokens) ->
label`, `acceptance_figure(summaries, suites=None, suite=None) -> Figure`, `plot_acceptance(
summaries, path, suites=None, suite=None)` (PNG, matplotlib Agg; `suites` adds tau per suite and
drafter). Importing this module does not import torch (report/ reads the labels).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflashx.store.atomic import atomic_path

if TYPE_CHECKING:
    from dflashx.dflash.spec_decode import DecodeResult

CONTEXT_BUCKETS = ((512, "<512"), (2048, "512-2K"), (8192, "2K-8K"), (32768, "8K-32K"), (None, ">=32K"))
CONTEXT_BUCKET_LABELS = tuple(label for _, label in CONTEXT_BUCKETS)
GROUP_KEYS = ("tau", "acceptance_by_position", "cycles", "prompts", "generated_tokens")
UNKNOWN_SOURCE = "unknown"
SOURCE_PANEL = "tau per source"
CONTEXT_PANEL = "tau by prompt length (tokens)"
SUITE_PANEL = "tau per suite"
SUITES_KEY = "suites"


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
        "tau": sum(r.decoded_after_first for r in results) / len(accepted) if accepted else 0.0,
        "accepted_plus_one": sum(a + 1 for a in accepted) / len(accepted) if accepted else 0.0,
        "acceptance_by_position": [h / o if o else None for h, o in zip(hits, offered)],
        "accept_length_histogram": [sum(a == n for a in accepted) for n in range(block_size)],
        "cycles": len(accepted),
        "prompts": len(results),
        "generated_tokens": tokens,
        "target_forwards": sum(r.target_forwards for r in results),
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else None,
    }


def context_bucket(prompt_tokens: int) -> str:
    """The context-length bucket of a prompt of `prompt_tokens` tokens."""
    return next(label for limit, label in CONTEXT_BUCKETS if limit is None or prompt_tokens < limit)


def summarize_groups(results: Sequence[DecodeResult], labels: Sequence[str], block_size: int,
                     order: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """`summarize` (its GROUP_KEYS) of the results sharing each label; only non-empty groups,
    in `order` when given, else sorted by label (so the JSON is the same however prompts came)."""
    members: dict[str, list[DecodeResult]] = {}
    for result, label in zip(results, labels, strict=True):
        members.setdefault(label, []).append(result)
    names = [n for n in order if n in members] if order is not None else sorted(members)
    out = {}
    for name in names:
        summary = summarize(members[name], block_size)
        out[name] = {k: summary[k] for k in GROUP_KEYS}
    return out


def drafter_summary(results: Sequence[DecodeResult], block_size: int, sources: Sequence[str],
                    buckets: Sequence[str]) -> dict[str, Any]:
    """One drafter's entry for one suite in eval.json: `summarize`, each prompt's tau, and the same
    figures per prompt source and per context bucket."""
    return summarize(results, block_size) | {
        "per_prompt_tau": [r.tau for r in results],
        "by_source": summarize_groups(results, sources, block_size),
        "by_context": summarize_groups(results, buckets, block_size, order=CONTEXT_BUCKET_LABELS),
    }


# Student's t, 97.5% quantile, for 1..30 degrees of freedom (any statistics table, e.g. NIST/SEMATECH
# e-Handbook of Statistical Methods, 1.3.6.7.2, "Critical values of the Student's t distribution").
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """Student's t 97.5% quantile at `df` >= 1 degrees of freedom: the table to 30, beyond it the
    Cornish-Fisher expansion about the normal quantile (within 0.001 of the exact value there)."""
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def sampled_summary(results_per_seed: Sequence[Sequence[DecodeResult]], block_size: int) -> dict[str, Any]:
    """tau at the serving temperature over seeds (module doc): `tau` the mean of `tau_per_seed`, `tau_se`
    its standard error, `tau_ci95` mean +- t975(seeds - 1) SE; acceptance, histogram and counts pooled over
    the seeds.
    At least 2 seeds (stages.eval.sampling_seeds has that bound)."""
    taus = [summarize(runs, block_size)["tau"] for runs in results_per_seed]
    pooled = summarize([r for runs in results_per_seed for r in runs], block_size)
    mean, se = statistics.fmean(taus), statistics.stdev(taus) / math.sqrt(len(taus))
    half = t975(len(taus) - 1) * se
    return {"tau": mean, "tau_se": se, "tau_ci95": [mean - half, mean + half], "tau_per_seed": taus,
            "seeds": len(taus), **{k: pooled[k] for k in ("acceptance_by_position", "accept_length_histogram",
                                                         "cycles", "generated_tokens", "seconds")}}


def _group_bars(ax: Any, summaries: dict[str, dict[str, Any]], key: str, title: str) -> None:
    """Grouped bars of each run's tau per label of `summaries[run][key]`; x labels carry the prompt count."""
    labels: list[str] = []
    for s in summaries.values():
        labels += [n for n in s.get(key, {}) if n not in labels]
    width = 0.8 / max(1, len(summaries))
    for i, (name, s) in enumerate(summaries.items()):
        groups = s.get(key, {})
        xs = [j + (i - (len(summaries) - 1) / 2) * width for j in range(len(labels))]
        ax.bar(xs, [groups.get(n, {}).get("tau", 0.0) for n in labels], width, label=name)
    first = next(iter(summaries.values()), {}).get(key, {})
    ax.set_xticks(range(len(labels)), [f"{n}\n({first.get(n, {}).get('prompts', 0)} prompts)" for n in labels])
    ax.set(ylabel="tau (tokens per target forward)", title=title)
    ax.grid(alpha=0.3, axis="y")
    if labels:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)


def by_suite(suites: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """{suite: {drafter: summary}} turned to {drafter: {"suites": {suite: summary}}} (one bar per drafter)."""
    out: dict[str, dict[str, Any]] = {}
    for suite, drafters in suites.items():
        for drafter, summary in drafters.items():
            out.setdefault(drafter, {SUITES_KEY: {}})[SUITES_KEY][suite] = summary
    return out


def acceptance_figure(summaries: dict[str, dict[str, Any]], suites: dict[str, dict[str, dict[str, Any]]] | None = None,
                      suite: str | None = None) -> Any:
    """The acceptance figure of `summaries` ({drafter: summary} on one suite, named `suite`):
    per-position acceptance and accepted-length histogram (top), tau per source and tau by context
    bucket (middle, one bar per drafter); with `suites` ({suite: {drafter: summary}}) a bottom row
    of tau per suite, one bar per drafter. The caller closes it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = 3 if suites else 2
    fig = plt.figure(figsize=(11, 4 * rows))
    grid = fig.add_gridspec(rows, 2)
    left, right = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
    by_source, by_context = fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])
    if suites:
        _group_bars(fig.add_subplot(grid[2, :]), by_suite(suites), SUITES_KEY, SUITE_PANEL)
    for name, s in summaries.items():
        acc = s["acceptance_by_position"]
        xs = [k + 1 for k, v in enumerate(acc) if v is not None]
        left.plot(xs, [v for v in acc if v is not None], marker="o", label=f"{name} (tau {s['tau']:.2f})")
        hist = s["accept_length_histogram"]
        total = sum(hist) or 1
        right.plot(range(len(hist)), [h / total for h in hist], marker="o", label=name)
    on = f" ({suite})" if suite else ""
    left.set(xlabel="draft position k", ylabel="P(position k accepted)", ylim=(0, 1.02),
             title=f"Acceptance per position{on}")
    right.set(xlabel="accepted drafts per cycle", ylabel="share of cycles", title=f"Accepted length{on}")
    for ax in (left, right):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend()
    _group_bars(by_source, summaries, "by_source", SOURCE_PANEL + on)
    _group_bars(by_context, summaries, "by_context", CONTEXT_PANEL + on)
    fig.tight_layout()
    return fig


def plot_acceptance(summaries: dict[str, dict[str, Any]], path: str | Path,
                    suites: dict[str, dict[str, dict[str, Any]]] | None = None, suite: str | None = None) -> Path:
    """Write `acceptance_figure(summaries, suites, suite)` as a PNG (atomically, no metadata text)."""
    import matplotlib.pyplot as plt

    path = Path(path)
    fig = acceptance_figure(summaries, suites, suite)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None}, dpi=110)
    plt.close(fig)
    return path
