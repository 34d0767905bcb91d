"""`dflashx plan RECIPE [OVERRIDES...] [--dry-run] [--json] [--explain] [--run-dir DIR] [--uncalibrated]`.

Loads the recipe (exit 2 when it cannot be read or validated), reads a local target's
config.json and the run dir's pilot calibration (the planner itself never reads files), plans,
and prints either a rich view or exactly one JSON object. Exit 0 without plan errors, 1 with.
With `--json` a recipe or target config that cannot be read is one JSON object too: its `errors`
say why, the rest is empty (exit 2).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dflashx.cli._common import (
    OverridesArg,
    RecipeArg,
    RunDirOpt,
    UncalibratedOpt,
    detect_local,
    format_finding,
    load_or_exit,
    pilot_calibration,
    target_facts,
)
from dflashx.config.errors import RecipeProblem, RecipeError
from dflashx.config.load import LoadedRecipe, load_recipe
from dflashx.plan.explain import human_bytes, human_count, human_seconds
from dflashx.report.fmt import band_text

if TYPE_CHECKING:
    from dflashx.plan.calibration import CalibrationReport
    from dflashx.plan.estimates.deployment import Deployment
    from dflashx.plan.plan import Plan
    from dflashx.plan.ranges import Band

DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Plan only (planning never runs anything).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print exactly one JSON object (see docs/planner.md).")]
ExplainOpt = Annotated[bool, typer.Option("--explain", help="Show every estimate's formula, inputs and source.")]


def _value(value: float, unit: str) -> str:
    if unit == "bytes":
        return human_bytes(value)
    if unit == "s":
        return human_seconds(value)
    if unit in ("fraction",):
        return f"{value:.1%}"
    if unit == "x":
        return f"{value:.2f}x"
    return f"{human_count(value)} {unit}"


def _inputs(inputs: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    return ", ".join(f"{k}={fmt(v)}" for k, v in inputs.items())


def span(band: Band | None, fmt: Callable[[float], str]) -> str:
    """`P10 – P90` of a range (`band_text`); `-` without one, empty when the stage's estimate has no spread."""
    if band is not None and band.p90 - band.p10 <= 0.005 * band.p50:
        return ""
    return band_text(band, fmt)


def _usd(value: float) -> str:
    return f"{value:,.0f}"


def calibration_lines(cal: CalibrationReport | None) -> list[str]:
    """Which figures a pilot measured (and which it could not vouch for any more), in words."""
    if cal is None:
        return []
    lines = [f"calibrated by the pilot of run {cal.run_id} ({cal.measured_at}, {cal.run_dir}):"]
    lines += [f"  {key} = {_short(value)}" for key, value in cal.applied.items()]
    for skipped in cal.not_applied:
        more = f" and {len(skipped.changed) - 3} more" if len(skipped.changed) > 3 else ""
        lines.append(f"  not applied ({skipped.group}): {', '.join(skipped.figures)} — measured under other "
                     f"values of {', '.join(skipped.changed[:3])}{more}")
    return lines


def deploy_lines(deploy: Deployment | None) -> list[str]:
    """The drafter's predicted serving speed-up before training (--explain: deploy.speedup)."""
    if deploy is None:
        return []
    cells = " · ".join(f"{r.speedup:.2f}x @{r.concurrency}" for r in deploy.rows)
    return [f"serving the drafter on {deploy.profile} at expected tau {deploy.tau:.2f} (block "
            f"{deploy.block_size}): {cells} (requests in flight per server; --explain: deploy.speedup)",
            f"  the drafter {deploy.crossover}",
            *(f"  {s.engine}: {s.text}" for s in deploy.switch_off)]


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def render(plan: Plan, title: str, explain: bool) -> None:
    """The human view: stages table with P10–P90, totals, commands, calibration, findings (and
    formulas with --explain). Drawn without rich: see `report.text_table`."""
    from dflashx.report.text_table import Styler, box_table

    style = Styler()
    headers = ("stage", "on", "time", "P10 – P90", "GPU-h", "USD", "USD P10 – P90", "storage", "peak mem/GPU")
    r = plan.ranges
    rows = []
    for stage in plan.stages:
        e = stage.estimates
        seconds, usd = (r.stages.get(stage.name), r.usd.get(stage.name)) if r else (None, None)
        rows.append((stage.name, "yes" if stage.enabled else "no", human_seconds(e.seconds),
                     span(seconds, human_seconds), f"{e.gpu_hours:,.1f}", _usd(e.usd), span(usd, _usd),
                     human_bytes(e.storage_bytes), human_bytes(e.peak_gpu_memory_bytes)))
    t = plan.totals
    rows.append(("total", "", human_seconds(t.seconds), span(r.total if r else None, human_seconds),
                 f"{t.gpu_hours:,.1f}", _usd(t.usd), span(r.usd["total"] if r else None, _usd),
                 human_bytes(t.storage_bytes), human_bytes(t.peak_gpu_memory_bytes)))
    lines = [box_table(title, headers, rows, [h not in ("stage", "on") for h in headers], bold_last=True, style=style)]
    if r:
        lines.append("P10 – P90: the mean output length's uncertainty and each model's error (--explain says which)")
    lines += calibration_lines(plan.calibration)
    lines += deploy_lines(plan.deploy)
    for stage in plan.stages:
        if stage.enabled and stage.commands:
            lines.append(style(stage.name, "bold") + " runs:")
            lines += [f"  {line}" for line in stage.commands]
    if explain:
        lines.append(style("how each number is estimated", "bold"))
        for term in plan.terms:
            lines += [f"  {term.key} = {_value(term.value, term.unit)}", f"      {term.formula}"]
            if term.inputs:
                lines.append(f"      inputs: {_inputs(term.inputs)}")
            if term.source:
                lines.append(f"      source: {term.source}")
    for findings, color in ((plan.warnings, "yellow"), (plan.errors, "red")):
        lines += [style(format_finding(f), color) for f in findings]
    verdict = f"{len(plan.errors)} error(s), {len(plan.warnings)} warning(s)"
    lines.append(style(verdict, "red" if plan.errors else "green"))
    sys.stdout.write("\n".join(lines) + "\n")


def _json_failure(problems: list[RecipeProblem]) -> typer.Exit:
    """The one JSON object of a recipe that cannot be planned: an empty plan's own document (`Plan.to_json`: no
    stage, zero totals, nothing resolved) whose errors are the recipe's problems, each with its file and line;
    returns the exit to raise (code 2)."""
    from dflashx.plan.context import totals
    from dflashx.plan.plan import Plan

    document = Plan((), (), totals([]), None).to_json() | {"errors": [p.to_json() for p in problems]}
    sys.stdout.write(json.dumps(document) + "\n")
    return typer.Exit(RecipeError.exit_code)


def _load_or_json_failure(recipe: Path, overrides: list[str] | None) -> tuple[LoadedRecipe, Any]:
    """The recipe and its target's facts, or (on stdout) the JSON object saying why not."""
    from dflashx.targets.facts import facts_for
    from dflashx.targets.read_config import ConfigFactsError

    try:
        loaded = load_recipe(recipe, overrides or (), local=detect_local)
        return loaded, facts_for(loaded.recipe.target)
    except RecipeError as exc:
        raise _json_failure(exc.problems) from None
    except ConfigFactsError as exc:
        fix = "point target.model at a complete config.json or set target.arch"
        raise _json_failure([RecipeProblem(str(exc), key="target.model", fix=fix)]) from None


def command(recipe: RecipeArg, overrides: OverridesArg = None, dry_run: DryRunOpt = False,
            json_output: JsonOpt = False, explain: ExplainOpt = False, run_dir: RunDirOpt = None,
            uncalibrated: UncalibratedOpt = False) -> None:
    from dflashx.plan.plan import make_plan

    if json_output:
        loaded, facts = _load_or_json_failure(recipe, overrides)
    else:
        loaded = load_or_exit(recipe, overrides)
        facts = target_facts(loaded.recipe)
    calibration = None if uncalibrated else pilot_calibration(loaded.recipe, run_dir)
    plan = make_plan(loaded.recipe, facts, calibration)
    if json_output:
        sys.stdout.write(json.dumps(plan.to_json(explain=explain)) + "\n")
    else:
        r = loaded.recipe
        render(plan, f"{r.name}: {r.target.model} on {r.hardware.name} (train {r.stages.train.mode})", explain)
    if plan.errors:
        raise typer.Exit(1)
