"""The eval stage's serving prediction: the trained drafter's measured acceptance at the temperature it
will be served at (`deploy.temperature`: the sampled runs' acceptance pooled over seeds, the greedy
run's at 0), served on the recipe's hardware profile (`dflashx.plan.estimates.deployment.predict_speedup`,
pure).

`section(recipe, result, report_dir)` returns eval.json's `predicted_speedup` (tokens/s with and without
the drafter per concurrency, the speed-up, the formula and its inputs) and draws speedup.png;
`metrics(result)` gives the stage's headline figures. The eval stage calls both in one place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dflashx.plan.estimates.deployment import predict_speedup
from dflashx.plan.estimates.speculative import drafter_window
from dflashx.resolve.model import ResolvedRecipe
from dflashx.store.atomic import atomic_path

KEY = "predicted_speedup"


def section(recipe: ResolvedRecipe, result: dict[str, Any], report_dir: Path | None = None) -> dict[str, Any]:
    """{KEY: the prediction} from the trained drafter's `acceptance_by_position` at the serving temperature
    (plot in `report_dir`)."""
    sampling = result.get("sampling")  # absent from an eval.json written before sampled runs
    served = result["trained"]["sampled"] if sampling else result["trained"]
    how = (f"temperature {sampling['temperature']:g}, top_p {sampling['top_p']:g}, top_k {sampling['top_k']}, "
           f"{sampling['seeds']} seeds" if sampling else "greedy")
    source = (f"measured: the eval's acceptance by position ({how}; tau {served['tau']:.2f}, {served['cycles']} "
              f"cycles, {result['prompts']} prompts)")
    prediction = predict_speedup(recipe, served["acceptance_by_position"], recipe.drafter.dims,
                                 result["block_size"], drafter_window(recipe), source=source).to_json()
    if report_dir is not None:
        plot(prediction, Path(report_dir) / "speedup.png")
    return {KEY: prediction}


def summary_text(prediction: dict[str, Any]) -> str:
    """`3.10x @1 · 2.40x @8 · ...`: the speed-up at each concurrency."""
    return " · ".join(f"{r['speedup']:.2f}x @{r['concurrency']}" for r in prediction["rows"])


def metrics(result: dict[str, Any]) -> dict[str, Any]:
    """Headline figures: the text, and the speed-up at each concurrency as its own number."""
    prediction = result.get(KEY)
    if not prediction:
        return {}
    return {KEY: summary_text(prediction),
            **{f"{KEY}_c{r['concurrency']}": r["speedup"] for r in prediction["rows"]}}


def plot(prediction: dict[str, Any], path: Path) -> Path:
    """Tokens/s with and without the drafter per concurrency (bars), the speed-up above each pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = prediction["rows"]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar([x - 0.2 for x in xs], [r["tokens_per_second"] for r in rows], 0.4, label="target alone")
    ax.bar([x + 0.2 for x in xs], [r["tokens_per_second_drafter"] for r in rows], 0.4, label="with the drafter")
    for x, r in zip(xs, rows):
        top = max(r["tokens_per_second"], r["tokens_per_second_drafter"])
        ax.annotate(f"{r['speedup']:.2f}x", (x, top), ha="center", va="bottom")
    ax.set_xticks(list(xs), [str(r["concurrency"]) for r in rows])
    ax.set(xlabel="requests in flight per server", ylabel="output tokens/s per server",
           title=f"Predicted on {prediction['profile']} (tau {prediction['tau']:.2f}, "
                 f"block {prediction['block_size']})")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None}, dpi=110)
    plt.close(fig)
    return path
