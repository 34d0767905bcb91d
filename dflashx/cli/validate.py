"""`dflashx validate RECIPE [OVERRIDES...]`: schema check (exit 2), then planner rules (exit 1)."""

from __future__ import annotations

from typing import Any

import typer

from dflashx.cli._common import OverridesArg, RecipeArg, load_or_exit, target_facts
from dflashx.config.load import LoadedRecipe
from dflashx.config.schema import STAGE_ORDER


def summary(loaded: LoadedRecipe) -> list[str]:
    """A few lines that say what the recipe is about."""
    r = loaded.recipe
    hw = r.hardware
    gpus = f"{hw.num_gpus}x {hw.gpu.name}" if hw.gpu else "CPU"
    stages = [s for s in STAGE_ORDER if getattr(r.stages, s).enabled]
    off = [s for s in STAGE_ORDER if s not in stages]
    samples = r.dataset.stats.samples
    return [
        f"  target    {r.target.model} ({r.target.precision}, thinking "
        f"{'on' if r.target.chat_template.enable_thinking else 'off'})",
        f"  drafter   {r.drafter.num_layers} layers, block size {r.drafter.block_size}, "
        f"{r.drafter.num_target_layers} target layers",
        f"  hardware  {hw.name} ({gpus})",
        f"  dataset   {len(r.dataset.sources)} source(s)" + (f", {samples:,} samples planned" if samples else ""),
        f"  stages    {', '.join(stages)}" + (f" (off: {', '.join(off)})" if off else ""),
        f"  train     {r.stages.train.mode}",
    ]


def _plan_findings(loaded: LoadedRecipe) -> dict[str, Any] | None:
    """The planner's errors and warnings, or None while dflashx.plan.plan is not built."""
    try:
        from dflashx.plan.plan import make_plan
    except ModuleNotFoundError as exc:
        if exc.name in ("dflashx.plan", "dflashx.plan.plan"):
            return None
        raise
    return make_plan(loaded.recipe, target_facts(loaded.recipe)).to_json()


def _finding(kind: str, f: dict[str, Any]) -> str:
    line = f"{kind} [{f.get('code')}] {f.get('key') or ''}: {f.get('message')}"
    return line + (f"\n    fix: {f['fix']}" if f.get("fix") else "")


def command(recipe: RecipeArg, overrides: OverridesArg = None) -> None:
    loaded = load_or_exit(recipe, overrides)
    typer.echo(f"recipe {recipe}: {loaded.recipe.name}")
    typer.echo("\n".join(summary(loaded)))
    plan = _plan_findings(loaded)
    if plan is None:
        typer.echo("schema OK (planner rules skipped: dflashx.plan is not available)")
        return
    for w in plan.get("warnings", []):
        typer.echo(_finding("warning", w))
    errors = plan.get("errors", [])
    for e in errors:
        typer.echo(_finding("error", e), err=True)
    if errors:
        typer.echo(f"FAILED: {len(errors)} planner error(s)", err=True)
        raise typer.Exit(1)
    typer.echo("OK")
