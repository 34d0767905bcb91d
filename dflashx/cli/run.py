"""`dflashx run RECIPE [OVERRIDES...]`: plan, preflight, the pilot (on a GPU profile, `pilot.enabled`),
then run (or resume) the recipe's stages.

What the terminal shows is `dflashx.report.console` (live rows on a terminal, stamped lines off
one, a summary and the next commands at the end); each stage's own output and its libraries'
noise go to `<stage>/stage.log` (`dflashx.track.output`).
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dflashx.cli._common import OverridesArg, RecipeArg, format_finding, load_or_exit, pilot_calibration, target_facts
from dflashx.cli.pilot import ContinueOpt

if TYPE_CHECKING:
    from dflashx.report.console import RunConsole


def command(
    recipe: RecipeArg,
    overrides: OverridesArg = None,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Default: <storage.root>/<recipe name>.")] = None,
    only: Annotated[str | None, typer.Option("--only", help="Run just this stage.")] = None,
    until: Annotated[str | None, typer.Option("--until", help="Run the stages up to and including this one.")] = None,
    force: Annotated[list[str] | None, typer.Option("--force",
                                                    help="Re-run this stage even if done (repeatable).")] = None,
    skip_preflight: Annotated[bool, typer.Option("--skip-preflight",
                                                 help="Start without the preflight checks.")] = False,
    skip_pilot: Annotated[bool, typer.Option("--skip-pilot",
                                             help="Do not run the pilot first (pilot.enabled).")] = False,
    continue_over_budget: ContinueOpt = False,
) -> None:
    from dflashx.report.console import RunConsole
    from dflashx.track.output import terminal

    with terminal() as stream, RunConsole(file=stream) as view, view.route_logs():
        view.line(f"dflashx run {recipe}: planning…")  # before the heavy imports: a line at once
        _run(view, recipe, overrides or [], run_dir, Flags(only, until, force or [], skip_preflight, skip_pilot,
                                                           continue_over_budget))


@dataclass
class Flags:
    only: str | None
    until: str | None
    force: list[str]
    skip_preflight: bool
    skip_pilot: bool
    continue_over_budget: bool


def _command(recipe: Path, overrides: list[str], run_dir: Path | None) -> str:
    return shlex.join(["dflashx", "run", str(recipe), *overrides, *(["--run-dir", str(run_dir)] if run_dir else [])])


def _run(view: RunConsole, recipe: Path, overrides: list[str], run_dir: Path | None, flags: Flags) -> None:
    from dflashx.cli.pilot import pilot_or_exit, preflight_or_exit
    from dflashx.plan.plan import make_plan
    from dflashx.report.progress import write_progress
    from dflashx.run.graph import select
    from dflashx.run.layout import default_run_dir
    from dflashx.run.orchestrator import run_pipeline
    from dflashx.run.pilot import pilot_due
    from dflashx.report.pilot import BUDGET_CODES
    from dflashx.run.rundir import RunDirBusy

    loaded = load_or_exit(recipe, overrides)
    try:
        selection = select(flags.only, flags.until, flags.force)
    except ValueError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    facts = target_facts(loaded.recipe)
    calibration = pilot_calibration(loaded.recipe, run_dir)
    made = make_plan(loaded.recipe, facts, calibration)
    plan = made.to_json()
    for finding in (*plan["warnings"], *plan["errors"]):
        typer.echo(format_finding(finding), err=True)
    blocking = [e for e in plan["errors"] if not (flags.continue_over_budget and e["code"] in BUDGET_CODES)]
    if made.resolved is None or blocking:
        over = any(e["code"] in BUDGET_CODES for e in blocking)
        typer.echo(f"{recipe}: the plan has {len(blocking)} error(s); nothing was run"
                   + (" (--continue-over-budget goes on over budget.*)" if over else ""), err=True)
        raise typer.Exit(1)
    target = run_dir or default_run_dir(made.resolved)
    view.line(f"run dir: {target}")
    if not flags.skip_preflight:
        preflight_or_exit(view, recipe, made.resolved, plan, target, selection.stages, selection.force)
    if "generate" in selection.stages and not flags.skip_pilot and pilot_due(loaded.recipe, target, calibration):
        made = pilot_or_exit(view, loaded.recipe, facts, target, flags.continue_over_budget)
        plan = made.to_json()
    try:
        result = run_pipeline(made.resolved, plan, target, selection, argv=sys.argv, observer=view,
                              on_progress=write_progress)
    except RunDirBusy as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        view.close(interrupted=True)
        typer.echo("interrupted: run the same command again to resume", err=True)
        raise typer.Exit(130) from None
    assert made.resolved is not None
    train = made.resolved.stages.train
    others = [o for o in overrides if o.split("=")[0] not in ("train.lr", "stages.train.lr")]
    retrain = _command(recipe, [*others, f"train.lr={train.lr / 5:g}"], run_dir) if train.enabled else None
    view.summary(result, _command(recipe, overrides, run_dir), retrain)
    if not result.ok:
        typer.echo(f"stopped; see `dflashx status {target}`", err=True)
        raise typer.Exit(1)
    view.line(f"all selected stages done; see `dflashx status {target}`")

