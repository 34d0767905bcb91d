"""Helpers shared by the CLI commands: recipe arguments, load-or-exit-2, target facts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dflashx.config.errors import RecipeError
from dflashx.config.load import LoadedRecipe, load_recipe

if TYPE_CHECKING:
    from dflashx.config.schema import Recipe
    from dflashx.targets.registry import TargetFacts

RecipeArg = Annotated[Path, typer.Argument(help="Recipe YAML file.", show_default=False)]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="Dotted overrides applied before validation, e.g. train.lr=1e-4 hardware=b200_nvl8 "
        "hardware.serving.dp=2 (a first key that is a stage name means stages.<name>).",
        show_default=False,
    ),
]


def exit_recipe_error(exc: RecipeError) -> typer.Exit:
    """Print a RecipeError (no traceback) on stderr; returns the exit to raise (code 2)."""
    typer.echo(exc.format(), err=True)
    return typer.Exit(RecipeError.exit_code)


def load_or_exit(recipe: Path, overrides: Sequence[str] | None = ()) -> LoadedRecipe:
    """`load_recipe`, turning a RecipeError into its message on stderr and exit code 2."""
    try:
        return load_recipe(recipe, overrides or ())
    except RecipeError as exc:
        raise exit_recipe_error(exc) from None


def target_facts(recipe: Recipe) -> TargetFacts | None:
    """Facts for the planner: a local target's config.json, else the registry (model, then arch)."""
    from dflashx.targets.read_config import ConfigFactsError, facts_from_config
    from dflashx.targets.registry import lookup

    config = Path(recipe.target.model) / "config.json"
    if config.is_file():
        try:
            return facts_from_config(json.loads(config.read_text(encoding="utf-8")), name=recipe.target.model)
        except (ConfigFactsError, json.JSONDecodeError) as exc:
            if recipe.target.arch and lookup(recipe.target.arch):
                return lookup(recipe.target.arch)
            typer.echo(f"{config}: {exc} (target.model)", err=True)
            raise typer.Exit(RecipeError.exit_code) from None
    return lookup(recipe.target.model) or (lookup(recipe.target.arch) if recipe.target.arch else None)
