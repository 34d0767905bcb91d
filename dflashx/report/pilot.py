"""What `dflashx pilot` prints: the plan's figures against the pilot's, and the plan before and after.

`sections(outcome)` -> [estimate vs measured, the plan's P10/P50/P90 before and after, the pilot's
own time]. When the re-plan stops the run is `dflashx.run.session`'s (its policies: `dflashx.run.policy`).
"""

from __future__ import annotations

from typing import Any

from dflashx.resolve.tau import curve_text
from dflashx.plan.estimates.lengths import OutputLengths
from dflashx.plan.estimates.tokens import count_tokens
from dflashx.plan.plan import Plan
from dflashx.plan.ranges import Band
from dflashx.plan.rules_training import still_rising
from dflashx.report.fmt import Section, band_text, human_seconds
from dflashx.run.pilot import PilotOutcome


def _term(plan: Plan, key: str) -> Any:
    return next((t for t in plan.terms if t.key == key), None)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _num(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:,.{digits}g}"


def _range(band: Band, fmt: Any) -> str:
    return f" ({band_text(band, fmt)})"


def comparison(outcome: PilotOutcome) -> Section:
    """The plan's figure (without the pilot) next to what the pilot measured."""
    before, m = outcome.before, outcome.calibration.measured
    recipe = before.resolved
    assert recipe is not None and before.ranges is not None
    stats, lengths, gen, train = recipe.dataset.stats, m["lengths"], m.get("generation") or {}, m.get("training") or {}
    dist = OutputLengths.of(stats)  # the plan's output lengths, and what a training sample keeps of them
    room = count_tokens(recipe, recipe.stages.train.max_length, dist).output_room
    r = before.ranges
    limit = recipe.stages.qc.thresholds.max_truncated_frac
    rows = [
        ["prompts to generate", _num(_term(before, "tokens.samples").value, 9), _num(m["samples"], 9),
         "ingest (the run's own stage)"],
        ["prompt tokens, mean", _num(stats.prompt_tokens_mean), _num(lengths["prompt_tokens_mean"]), ""],
        ["output tokens, mean", _num(dist.mean) + _range(r.mean, _num),
         f"{_num(lengths['output_tokens_mean'])} ± {_num(lengths['output_tokens_mean_se'], 2)}",
         f"{lengths['completions']} completions (± one standard error, by source)"],
        ["output tokens, p90", _num(dist.quantile(0.9)), _num(lengths["output_tokens_p90"]), dist.source],
        [f"stopped at max_tokens {recipe.stages.generate.max_tokens:,}", _pct(r.truncated.p50)
         + _range(r.truncated, _pct), _pct(lengths["truncated_share"]), f"QC limit {_pct(limit)}"],
        [f"cut at max_length {recipe.stages.train.max_length:,}", _pct(dist.share_above(room)),
         _pct(lengths["train_cut_share"]), "prompt + output tokens"],
    ]
    if gen:
        batch = f", a draining batch of {gen['batch']}/server" if gen.get("batch") else ""
        gpus = recipe.hardware.num_gpus
        per_gpu = f"; {gen['measured_tokens_per_s'] / gpus:,.0f} per GPU" if gpus else ""
        rows.append(["generation tokens/s", _num(gen["predicted_tokens_per_s"]), _num(gen["measured_tokens_per_s"]),
                     f"the pilot's {gen['completions']} prompts{batch}: ratio {_num(gen['ratio'], 3)}{per_gpu}"])
    if train:
        rows += [["training MFU", _num(train["mfu_planned"], 3), _num(train["mfu"], 3),
                  f"median of {train['windows']} windows; plan: the table's {train['mfu_source'].split(':')[0]} row"],
                 ["training step", human_seconds(train["step_s_planned"]), human_seconds(train["step_s"]),
                  "per optimizer step, the pilot's data"],
                 ["training tokens/s per GPU", "", _num(train["tokens_per_s_per_gpu"]), ""]]
    curve = tuple(outcome.calibration.tau_curve)
    if curve:
        trend = "still rising at the pilot's end" if still_rising(curve) else "not rising at the pilot's end"
        rows.append(["held-out τ", "", _num(curve[-1].tau, 3), f"{curve_text(curve)} ({trend})"])
    return Section("Estimate vs measured", ["figure", "plan", "pilot", "note"], rows)


def _plan_row(label: str, plan: Plan) -> list[str]:
    t, r = plan.totals, plan.ranges
    assert r is not None
    return [label, human_seconds(t.seconds) + _range(r.total, human_seconds),
            f"{t.usd:,.0f}" + _range(r.usd["total"], lambda v: f"{v:,.0f}"),
            f"{len(plan.errors)} error(s)"]


def replan(outcome: PilotOutcome) -> Section:
    return Section("The plan: P50 (P10 – P90)", ["", "time", "USD", "findings"],
                   [_plan_row("before the pilot", outcome.before),
                    _plan_row("with the pilot's figures", outcome.after)],
                   f"calibration: {outcome.path}")


def timing(outcome: PilotOutcome) -> Section:
    return Section("The pilot's own time", ["step", "time"],
                   [[k, human_seconds(v)] for k, v in outcome.seconds.items()])


def sections(outcome: PilotOutcome) -> list[Section]:
    return [comparison(outcome), replan(outcome), timing(outcome)]
