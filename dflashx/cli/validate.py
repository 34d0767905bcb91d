"""`dflashx validate RECIPE [OVERRIDES...]`: schema check (exit 2), then planner rules (exit 1)."""

from __future__ import annotations


import typer

from dflashx.cli._common import OverridesArg, RecipeArg, format_finding, load_or_exit, target_facts
from dflashx.config.load import LoadedRecipe
from dflashx.config.schema import STAGE_ORDER
from dflashx.plan.plan import make_plan


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


def command(recipe: RecipeArg, overrides: OverridesArg = None) -> None:
    loaded = load_or_exit(recipe, overrides)
    typer.echo(f"recipe {recipe}: {loaded.recipe.name}")
    typer.echo("\n".join(summary(loaded)))
    plan = make_plan(loaded.recipe, target_facts(loaded.recipe))
    for w in plan.warnings:
        typer.echo(format_finding(w))
    errors = plan.errors
    for e in errors:
        typer.echo(format_finding(e))
    if errors:
        typer.echo(f"FAILED: {len(errors)} planner error(s)")
        raise typer.Exit(1)
    typer.echo("OK")
