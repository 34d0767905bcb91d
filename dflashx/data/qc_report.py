"""Write a QC result as a folder: report.md (verdicts), qc.json (machine-readable) and PNG histograms.

The folder is a function of the result alone, byte for byte: the input is named by the label the
caller gives (the QC stage passes a run-relative one, never an absolute path), no dates or times
are written, and the PNGs carry no metadata (matplotlib's default `Software` text names its version).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from dflashx.data.qc_checks import QCResult
from dflashx.store.atomic import atomic_path
from dflashx.store.manifest import atomic_write_text

HISTOGRAMS = (
    ("mask_sizes", "loss_mask_sizes.png", "Loss-mask size per sample"),
    ("reasoning_words", "reasoning_words.png", "Reasoning length (words)"),
    ("answer_words", "answer_words.png", "Answer length (words)"),
)
PNG_METADATA = {"Software": None}  # matplotlib writes no other text (no creation time) into a PNG


def _histogram(values: Sequence[int], path: Path, title: str, unit: str, spike_max: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = np.asarray(values)
    fig, (full, small) = plt.subplots(1, 2, figsize=(10, 3.5))
    full.hist(data, bins=min(100, max(1, len(np.unique(data)))), color="#4472c4")
    full.set(title=title, xlabel=unit, ylabel="samples")
    low = data[data <= spike_max]
    small.hist(low, bins=np.arange(-0.5, spike_max + 1.5, 1.0), color="#c0504d")
    small.set(title=f"up to {spike_max} {unit} (a spike here is an error)", xlabel=unit)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=80, metadata=PNG_METADATA)
    plt.close(fig)


def _summary(values: Sequence[int]) -> dict[str, float]:
    if not len(values):
        return {}
    data = np.asarray(values)
    p50, p90, p99 = np.percentile(data, [50, 90, 99])
    return {"count": len(data), "mean": float(data.mean()), "min": int(data.min()), "p50": float(p50),
            "p90": float(p90), "p99": float(p99), "max": int(data.max())}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _per_source_lines(result: QCResult) -> list[str]:
    """The per-source table: each source's share of samples, of loss tokens (words) and truncations."""
    unit = result.stats.unit
    lines = ["", "## Per source", "", f"| source | samples | share | loss {unit} | share of loss {unit} | "
             "loss measured on | truncated | truncated share | rejected |", "|---|---|---|---|---|---|---|---|---|"]
    for name, s in result.stats.per_source().items():
        label = name.replace("|", "\\|")
        lines.append(f"| {label} | {s['samples']} | {_pct(s['share'])} | {s[f'loss_{unit}']} | "
                     f"{_pct(s['loss_share'])} | {s['loss_measured']} | {s['truncated']} | "
                     f"{_pct(s['truncated_frac'])} | {s['rejected']} |")
    return lines


def _markdown(result: QCResult, source: str, images: list[str], summaries: dict[str, dict[str, float]]) -> str:
    verdict = "PASSED" if result.passed else "FAILED"
    lines = [f"# QC report: {verdict}", "", f"Input: `{source}` — {result.stats.n} samples.", "",
             f"Note: {result.unit_note}.", ""]
    if not result.passed:
        lines += ["## What is wrong", "", *result.message().splitlines()[1:], ""]
    lines += ["## Checks", "", "| check | result | value | limit | measured on | detail |",
              "|---|---|---|---|---|---|"]
    for c in result.checks:
        state = "skipped" if c.skipped else ("pass" if c.passed else "**FAIL**")
        value = "" if c.value is None else f"{c.value:.2%}"
        lines.append(f"| {c.name} | {state} | {value} | {c.limit:.2%} | {c.measured_on} | {c.detail} |")
    lines += ["", "## Distributions", "", "| measure | count | mean | p50 | p90 | p99 | max |",
              "|---|---|---|---|---|---|---|"]
    for name, s in summaries.items():
        if s:
            lines.append(f"| {name} | {s['count']} | {s['mean']:.1f} | {s['p50']:.0f} | {s['p90']:.0f} | "
                         f"{s['p99']:.0f} | {s['max']} |")
    lines += _per_source_lines(result)
    lines += ["", *[f"![{img}]({img})" for img in images]]
    examples = [(c.name, c.examples) for c in result.failed if c.examples]
    if examples:
        lines += ["", "## Example sample ids", "", *[f"- {name}: {', '.join(ids)}" for name, ids in examples]]
    return "\n".join(lines) + "\n"


def write_report(result: QCResult, out_dir: str | Path, spike_max: int, source: str | None = None) -> dict[str, str]:
    """Write report.md, qc.json and the histograms into `out_dir`; return their file names.

    `source` names the input in both files (default: `result.path` as given to `run_qc`)."""
    source = result.path if source is None else source
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    images, summaries = [], {}
    for attr, name, title in HISTOGRAMS:
        values = getattr(result.stats, attr)
        summaries[attr] = _summary(values)
        if len(values):
            unit = result.stats.unit if attr == "mask_sizes" else "words"
            _histogram(values, out / name, title, unit, spike_max)
            images.append(name)
    payload = {**result.to_json(), "path": source, "distributions": summaries, "images": images}
    atomic_write_text(out / "qc.json", json.dumps(payload, indent=2))
    text = _markdown(result, source, images, summaries)
    atomic_write_text(out / "report.md", text)
    return {"report": "report.md", "json": "qc.json", **{Path(i).stem: i for i in images}}
