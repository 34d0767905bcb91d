"""Helpers shared by the CLI commands: recipe arguments, load-or-exit-2, target facts, the console."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dflashx.config.errors import RecipeError
from dflashx.config.load import LoadedRecipe, load_recipe

if TYPE_CHECKING:
    from rich.console import Console

    from dflashx.config.schema import HardwareProfile, Recipe
    from dflashx.plan.calibration import PilotCalibration
    from dflashx.plan.findings import Finding
    from dflashx.targets.registry import TargetFacts

RunDirOpt = Annotated[Path | None, typer.Option("--run-dir", help="Default: <storage.root>/<recipe name>.")]
UncalibratedOpt = Annotated[bool, typer.Option(
    "--uncalibrated", help="Ignore the figures a pilot measured (<run dir>/pilot/calibration.json).")]
ContinueOpt = Annotated[bool, typer.Option(
    "--continue-over-budget", help="Go on when the pilot's re-plan breaks budget.* (the numbers are printed).")]
SkipPreflightOpt = Annotated[bool, typer.Option("--skip-preflight", help="Start without the preflight checks.")]
RecipeArg = Annotated[Path, typer.Argument(help="Recipe YAML file.", show_default=False)]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="Dotted overrides applied before validation, e.g. train.lr=1e-4 hardware=b200_nvl8 "
        "generate.serving.dp=2 (a first key that is a stage name means stages.<name>).",
        show_default=False,
    ),
]


def exit_recipe_error(exc: RecipeError) -> typer.Exit:
    """Print a RecipeError (no traceback) on stderr; returns the exit to raise (code 2)."""
    typer.echo(exc.format(), err=True)
    return typer.Exit(RecipeError.exit_code)


def detect_local() -> HardwareProfile:
    """`hardware: local`: this machine's profile (`dflashx.run.local_hardware`), imported and run only when a
    recipe asks for it: the plan of another profile starts no nvidia-smi and imports no torch for it."""
    from dflashx.run.local_hardware import local_profile

    return local_profile()


def load_or_exit(recipe: Path, overrides: Sequence[str] | None = ()) -> LoadedRecipe:
    """`load_recipe` (`hardware: local` detected by `detect_local`), turning a RecipeError into its message
    on stderr and exit code 2."""
    try:
        return load_recipe(recipe, overrides or (), local=detect_local)
    except RecipeError as exc:
        raise exit_recipe_error(exc) from None


def target_facts(recipe: Recipe) -> TargetFacts | None:
    """`dflashx.targets.facts.facts_for`, an unreadable config.json becoming exit 2."""
    from dflashx.targets.facts import facts_for
    from dflashx.targets.read_config import ConfigFactsError

    try:
        return facts_for(recipe.target)
    except ConfigFactsError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(RecipeError.exit_code) from None


def format_finding(finding: Finding) -> str:
    """One plan finding as `dflashx plan`, `validate` and `run` print it: severity, code, key, fix."""
    line = f"{finding.severity} [{finding.code}] {finding.key}: {finding.message}"
    return line + (f"\n    fix: {finding.fix}" if finding.fix else "")


def make_console(**kwargs: Any) -> Console:
    """The rich Console a command prints with: as usual on a terminal; off one (a pipe, a file, a
    test) without colour and as wide as its tables need, so `dflashx inventory RUN | cat` shows
    whole cells (`dflashx.report.fmt.wide_console`)."""
    from dflashx.report.fmt import wide_console

    return wide_console(**kwargs)


def pilot_calibration(recipe: Recipe, run_dir: Path | None) -> PilotCalibration | None:
    """The pilot's measurements for this recipe's run dir, None when no pilot ran there; an unreadable
    file is exit 2, naming it and the fix."""
    from pydantic import ValidationError

    from dflashx.plan.calibration import PilotCalibration
    from dflashx.run.layout import calibration_path, default_run_dir

    path = calibration_path(run_dir or default_run_dir(recipe))
    if not path.is_file():
        return None
    try:
        return PilotCalibration.model_validate_json(path.read_bytes())
    except (ValidationError, ValueError, OSError) as exc:
        typer.echo(f"{path}: not a pilot calibration ({str(exc).splitlines()[0]}); run `dflashx pilot` again to "
                   "rewrite it, delete it, or plan with --uncalibrated", err=True)
        raise typer.Exit(RecipeError.exit_code) from None
