"""P10 / P50 / P90 of each stage's time and cost, and of the totals.

Over hundreds of thousands of samples the per-sample spread of output lengths averages out; what
is uncertain is (1) the mean output length, and (2) the models themselves.

(1) The mean: measured on n completions its standard error is sd / sqrt(n) (per source, weighted
    by each source's share, when a pilot is stratified): `dataset.stats.output_tokens_mean_se`.
    A mean without one is a person's estimate, taken to be within a factor GUESS_FACTOR of the
    truth at P10 and P90 (an assumption, said so in `--explain`). The plan is made again with every
    output length scaled to the P10 and P90 means (`scaled_stats` -> the same `build_context`),
    so truncation, batch sizes and the attention terms move with them.
(2) The models: each stage with a model error (`MODEL_ERROR`, P90/P50 factor, with its source)
    widens its range; a stage calibrated on this node by a pilot uses the measurement's relative
    standard error instead. Stage errors are independent; the length scenario moves every stage at
    once. Per stage, in logs: low = sqrt(ln(P50/P10_len)^2 + ln(f)^2), and the same above.
Cost follows time: every stage bills the whole node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dflashx.plan.context import PlanContext, build_context, stage_estimates
from dflashx.plan.estimates.cost import usd
from dflashx.plan.estimates.device import CALIBRATED_MFU, CALIBRATED_SERVING
from dflashx.plan.estimates.lengths import scaled_stats
from dflashx.plan.estimates.mfu import MEASURED
from dflashx.plan.explain import Term, explained_parts, term
from dflashx.plan.expr import Expr, Named, const, exp, hypot, ln, named, var

Z90 = 1.2815515655446004  # standard normal 90th percentile
GUESS_FACTOR = 1.5
# P90 / P50 of each model's error, uncalibrated.
MODEL_ERROR: dict[str, tuple[float, str]] = {
    "generate": (1.272, "the serving model's validation errors (benchmarks/planner_accuracy.json, 30 generation "
                        "rows, dense and MoE): median |ln(predicted / measured)| 0.127, read as a log-normal error "
                        "(sigma 0.19)"),
    "train": (MEASURED[("hopper", "bf16", "dense")].mfu / MEASURED[("hopper", "bf16", "hybrid")].mfu,
              "the one FLOP model's MFU differs 1.13x between the two measured target shapes "
              "(65.4% Qwen3-32B vs 57.7% Qwen3.6-27B, the product trainer on the H200): a shape "
              "or GPU without its own measurement may land that far off"),
}
CALIBRATED_KEY = {"generate": CALIBRATED_SERVING, "train": CALIBRATED_MFU}
PILOT_GROUP = {"generate": "serving", "train": "training"}


@dataclass(frozen=True)
class Band:
    p10: float
    p50: float
    p90: float

    def to_json(self) -> dict[str, float]:
        return {"p10": self.p10, "p50": self.p50, "p90": self.p90}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Band:
        return cls(float(data["p10"]), float(data["p50"]), float(data["p90"]))

    def times(self, factor: float) -> "Band":
        return Band(self.p10 * factor, self.p50 * factor, self.p90 * factor)


@dataclass(frozen=True)
class Ranges:
    mean: Band  # output tokens per completion (uncapped mean)
    truncated: Band  # share of completions stopping at max_tokens
    stages: dict[str, Band]  # stage -> seconds
    total: Band  # seconds
    usd: dict[str, Band]  # stage -> USD, and "total"
    terms: tuple[Term, ...] = field(default=(), compare=False)  # --explain's view; not in plan.json

    def to_json(self) -> dict[str, Any]:
        return {
            "output_tokens_mean": self.mean.to_json(), "truncated_share": self.truncated.to_json(),
            "stages": {name: {"seconds": b.to_json(), "usd": self.usd[name].to_json()}
                       for name, b in self.stages.items()},
            "totals": {"seconds": self.total.to_json(), "usd": self.usd["total"].to_json(),
                       "days": self.total.times(1 / 86_400).to_json()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ranges:
        """From `to_json`'s dict (the terms are not in it: `Plan.from_json` reads `explain`)."""
        stages = data["stages"]
        return cls(Band.from_json(data["output_tokens_mean"]), Band.from_json(data["truncated_share"]),
                   {n: Band.from_json(s["seconds"]) for n, s in stages.items()},
                   Band.from_json(data["totals"]["seconds"]),
                   {n: Band.from_json(s["usd"]) for n, s in stages.items()}
                   | {"total": Band.from_json(data["totals"]["usd"])})


def mean_factors(ctx: PlanContext) -> tuple[float, float, str]:
    """The P10 and P90 output-length mean as factors of the stated one, and where they come from."""
    stats, mean = ctx.recipe.dataset.stats, ctx.lengths.mean
    se = stats.output_tokens_mean_se
    if se is None:
        return 1 / GUESS_FACTOR, GUESS_FACTOR, (
            f"no dataset.stats.output_tokens_mean_se: the mean is taken as an estimate within a factor "
            f"{GUESS_FACTOR:g} at P10/P90 (an assumption; `dflashx pilot` measures it)")
    rel = Z90 * se / mean if mean else 0.0
    return (max(1 - rel, 0.05), 1 + rel,
            f"standard error {se:.3g} tokens (dataset.stats.output_tokens_mean_se): mean ± {Z90:.2f} se")


def model_error(ctx: PlanContext, stage: str, rse: dict[str, float]) -> tuple[float, str]:
    """ln(P90/P50) of the stage's model and its source; a pilot's calibration replaces the model's."""
    if stage not in MODEL_ERROR:
        return 0.0, ""
    factor, source = MODEL_ERROR[stage]
    if CALIBRATED_KEY[stage] in ctx.recipe.hardware.calibrated:
        group = PILOT_GROUP[stage]
        if group in rse:
            return Z90 * rse[group], f"measured by the pilot on this node: relative standard error {rse[group]:.1%}"
        return math.log(factor), (f"calibrated (hardware.calibrated.{CALIBRATED_KEY[stage]}) without a stated "
                                  f"error: {source}")
    return math.log(factor), source


@dataclass(frozen=True)
class _Spread:
    """A band around `p50` as expressions (their `--explain` text is read off them): P10 and P90 from the
    length scenarios' logs and the model's log error, combined in quadrature."""

    p50: float
    p10: Named
    p90: Named

    @property
    def band(self) -> Band:
        return Band(self.p10.value, self.p50, self.p90.value)


def _spread(low: float, mid: float, high: float, log_error: Expr) -> _Spread:
    """The band around `mid` from the length scenarios `low`/`high` widened by a model's log error."""
    if mid <= 0:
        return _Spread(0.0, named("p10", const(0.0)), named("p90", const(0.0)))
    p50 = var("p50", mid)
    down = named("log_length_low", ln(p50 / var("length_p10", low))) if low > 0 else const(0.0)
    up = named("log_length_high", ln(var("length_p90", high) / p50)) if high > 0 else const(0.0)
    return _Spread(mid, named("p10", p50 / exp(hypot(down, log_error))), named("p90", p50 * exp(hypot(up, log_error))))


def plan_ranges(ctx: PlanContext, rse: dict[str, float] | None = None) -> Ranges:
    """Re-plans the P10 and P90 mean-length scenarios and combines them with each model's error."""
    rse = rse or {}
    f10, f90, mean_source = mean_factors(ctx)
    recipe, stats = ctx.recipe, ctx.recipe.dataset.stats
    low, high = (build_context(recipe.model_copy(update={"dataset": recipe.dataset.model_copy(
        update={"stats": scaled_stats(stats, f)})})) for f in (f10, f90))
    names = [name for name, stage in recipe.stages if stage.enabled]
    seconds = {n: [stage_estimates(c, n).seconds for c in (low, ctx, high)] for n in names}
    errors = {n: model_error(ctx, n, rse) for n in names}
    spreads = {n: _spread(seconds[n][0], seconds[n][1], seconds[n][2], var("log_model_error", errors[n][0]))
               for n in names}
    stages = {n: s.band for n, s in spreads.items()}
    mid_total = sum(s[1] for s in seconds.values())
    model_total = named("log_model_error", hypot(*(var(f"{n}_seconds", seconds[n][1])
                                                    * var(f"{n}_log_model_error", errors[n][0]) for n in names
                                                    if errors[n][0]))
                        / var("total_p50", mid_total)) if mid_total else const(0.0)
    totals = _spread(sum(s[0] for s in seconds.values()), mid_total, sum(s[2] for s in seconds.values()), model_total)
    total = totals.band
    rate = usd(1.0, ctx.recipe.hardware)  # USD per second of the node
    costs = {n: b.times(rate) for n, b in stages.items()} | {"total": total.times(rate)}
    cap = recipe.stages.generate.max_tokens
    mean = Band(low.lengths.mean, ctx.lengths.mean, high.lengths.mean)
    truncated = Band(*(c.lengths.share_above(cap) for c in (low, ctx, high)))
    terms = (
        term("ranges.output_tokens_mean", mean.p50, "tokens", "P10 / P90 of the mean output length", p10=mean.p10,
             p90=mean.p90, source_of_range=mean_source),
        term("ranges.truncated_share", truncated.p50, "fraction",
             "share of completions longer than generate.max_tokens at the P10 / P50 / P90 mean", p10=truncated.p10,
             p90=truncated.p90, max_tokens=cap, qc_limit=recipe.stages.qc.thresholds.max_truncated_frac),
        *(explained_parts(f"ranges.{n}.seconds", stages[n].p50, "s", spreads[n].p10, spreads[n].p90,
                          model_error=math.exp(errors[n][0]), model_error_source=errors[n][1])
          for n in names if errors[n][0]),
        explained_parts("ranges.total_seconds", total.p50, "s", totals.p10, totals.p90,
                        model_error=math.exp(model_total.value),
                        note="length scenarios re-planned; stage model errors independent, combined in quadrature"),
    )
    return Ranges(mean, truncated, stages, total, costs, terms)
