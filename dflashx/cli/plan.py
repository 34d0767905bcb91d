"""`dflashx plan RECIPE [OVERRIDES...] [--dry-run] [--json] [--explain]`.

Loads the recipe (exit 2 when it cannot be read or validated), reads a local target's
config.json (the planner itself never reads files), plans, and prints either a rich view or
exactly one JSON object. Exit 0 without plan errors, 1 with. With `--json` a recipe or target
config that cannot be read is one JSON object too: its `errors` say why, the rest is empty (exit 2).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from dflashx.cli._common import OverridesArg, RecipeArg, format_finding, load_or_exit, make_console, target_facts
from dflashx.config.errors import Problem, RecipeError
from dflashx.config.load import LoadedRecipe, load_recipe
from dflashx.plan.explain import human_bytes, human_count, human_seconds

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
    return f"{human_count(value)} {unit}"


def _inputs(inputs: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    return ", ".join(f"{k}={fmt(v)}" for k, v in inputs.items())


def render(plan: dict[str, Any], title: str, explain: bool) -> None:
    """The human view: stages table, totals, commands, findings (and formulas with --explain)."""
    from rich.markup import escape
    from rich.table import Table

    console = make_console()
    table = Table(title=title)
    for col in ("stage", "on", "time", "GPU-h", "USD", "storage", "peak mem/GPU"):
        table.add_column(col, justify="left" if col in ("stage", "on") else "right")
    for stage in plan["stages"]:
        e = stage["estimates"]
        table.add_row(stage["name"], "yes" if stage["enabled"] else "no", human_seconds(e["seconds"]),
                      f"{e['gpu_hours']:,.1f}", f"{e['usd']:,.0f}", human_bytes(e["storage_bytes"]),
                      human_bytes(e["peak_gpu_memory_bytes"]))
    t = plan["totals"]
    table.add_row("[bold]total", "", f"[bold]{human_seconds(t['seconds'])}", f"[bold]{t['gpu_hours']:,.1f}",
                  f"[bold]{t['usd']:,.0f}", f"[bold]{human_bytes(t['storage_bytes'])}",
                  f"[bold]{human_bytes(t['peak_gpu_memory_bytes'])}")
    console.print(table)
    for stage in plan["stages"]:
        if stage["enabled"] and stage["commands"]:
            console.print(f"[bold]{stage['name']}[/bold] runs:")
            for line in stage["commands"]:
                console.print(f"  {line}", soft_wrap=True, highlight=False, markup=False)
    if explain:
        console.print("[bold]how each number is estimated[/bold]")
        for term in plan["explain"]:
            console.print(f"  {term['key']} = {_value(term['value'], term['unit'])}", highlight=False, markup=False)
            console.print(f"      {term['formula']}", highlight=False, markup=False)
            if term["inputs"]:
                console.print(f"      inputs: {_inputs(term['inputs'])}", highlight=False, markup=False)
    for kind, style in (("warnings", "yellow"), ("errors", "red")):
        for f in plan[kind]:
            console.print(f"[{style}]{escape(format_finding(f))}[/{style}]", highlight=False)
    verdict = f"{len(plan['errors'])} error(s), {len(plan['warnings'])} warning(s)"
    console.print(("[red]" if plan["errors"] else "[green]") + verdict)


def _json_failure(problems: list[Problem]) -> typer.Exit:
    """The one JSON object of a recipe that cannot be planned; returns the exit to raise (code 2)."""
    document = {"errors": [p.to_json() for p in problems], "warnings": [], "stages": [], "totals": None, "resolved": None}
    sys.stdout.write(json.dumps(document) + "\n")
    return typer.Exit(RecipeError.exit_code)


def _load_or_json_failure(recipe: Path, overrides: list[str] | None) -> tuple[LoadedRecipe, Any]:
    """The recipe and its target's facts, or (on stdout) the JSON object saying why not."""
    from dflashx.targets.facts import facts_for
    from dflashx.targets.read_config import ConfigFactsError

    try:
        loaded = load_recipe(recipe, overrides or ())
        return loaded, facts_for(loaded.recipe.target)
    except RecipeError as exc:
        raise _json_failure(exc.problems) from None
    except ConfigFactsError as exc:
        raise _json_failure([Problem(str(exc), key="target.model",
                                     hint="point target.model at a complete config.json or set target.arch")]) from None


def command(recipe: RecipeArg, overrides: OverridesArg = None, dry_run: DryRunOpt = False,
            json_output: JsonOpt = False, explain: ExplainOpt = False) -> None:
    from dflashx.plan.plan import make_plan

    if json_output:
        loaded, facts = _load_or_json_failure(recipe, overrides)
    else:
        loaded = load_or_exit(recipe, overrides)
        facts = target_facts(loaded.recipe)
    plan = make_plan(loaded.recipe, facts).to_json(explain=explain)
    if json_output:
        sys.stdout.write(json.dumps(plan) + "\n")
    else:
        r = loaded.recipe
        render(plan, f"{r.name}: {r.target.model} on {r.hardware.name} (train {r.stages.train.mode})", explain)
    if plan["errors"]:
        raise typer.Exit(1)
