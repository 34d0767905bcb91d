"""`dflashx run RECIPE [OVERRIDES...]`: plan, then run (or resume) the recipe's stages."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from dflashx.cli._common import OverridesArg, RecipeArg, format_finding, load_or_exit, target_facts


def command(
    recipe: RecipeArg,
    overrides: OverridesArg = None,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Default: <storage.root>/<recipe name>.")] = None,
    only: Annotated[str | None, typer.Option("--only", help="Run just this stage.")] = None,
    until: Annotated[str | None, typer.Option("--until", help="Run the stages up to and including this one.")] = None,
    force: Annotated[list[str] | None, typer.Option("--force", help="Re-run this stage even if done (repeatable).")] = None,
    skip_preflight: Annotated[bool, typer.Option("--skip-preflight", help="Start without the preflight checks.")] = False,
) -> None:
    from dflashx.cli.preflight import echo_problems, failures
    from dflashx.plan.plan import make_plan
    from dflashx.report.progress import write_progress
    from dflashx.run.graph import select
    from dflashx.run.orchestrator import default_run_dir, run_pipeline
    from dflashx.run.preflight import preflight, stages_to_check
    from dflashx.run.rundir import RunDirBusy
    from dflashx.track.redact import install_console_logging

    install_console_logging()
    loaded = load_or_exit(recipe, overrides)
    try:
        selection = select(only, until, force or ())
    except ValueError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    made = make_plan(loaded.recipe, target_facts(loaded.recipe))
    plan = made.to_json()
    for finding in (*plan["warnings"], *plan["errors"]):
        typer.echo(format_finding(finding), err=True)
    if made.resolved is None or plan["errors"]:
        typer.echo(f"{recipe}: the plan has {len(plan['errors'])} error(s); nothing was run", err=True)
        raise typer.Exit(1)
    target = run_dir or default_run_dir(made.resolved)
    typer.echo(f"run dir: {target}")
    if not skip_preflight:
        checks = preflight(made.resolved, plan, target, stages_to_check(made.resolved, target, selection.stages,
                                                                         selection.force))
        echo_problems(checks, typer.echo)
        if failures(checks):
            typer.echo(f"{recipe}: the preflight failed; nothing was run (fix the above, or --skip-preflight)", err=True)
            raise typer.Exit(1)
    try:
        result = run_pipeline(made.resolved, plan, target, selection, argv=sys.argv, echo=typer.echo,
                              on_progress=write_progress)
    except RunDirBusy as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        typer.echo("interrupted: run the same command again to resume", err=True)
        raise typer.Exit(130) from None
    if not result.ok:
        typer.echo(f"stopped; see `dflashx status {target}`", err=True)
        raise typer.Exit(1)
    typer.echo(f"all selected stages done; see `dflashx status {target}`")
