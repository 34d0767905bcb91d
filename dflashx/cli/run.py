"""`dflashx run RECIPE [OVERRIDES...]`: plan, preflight, the pilot (on a GPU profile, `pilot.enabled`),
then run (or resume) the recipe's stages: `dflashx.run.session.run_recipe`, which holds the policy
(what stops a run, when the pilot runs, the retrain hint); this command parses, calls and prints.

What the terminal shows is `dflashx.cli.view` over `dflashx.report.console` (live rows on a
terminal, stamped lines off one, a summary and the next commands at the end); each stage's own
output and its libraries' noise go to `<stage>/stage.log` (`dflashx.track.output`).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from dflashx.cli._common import (
    ContinueOpt,
    OverridesArg,
    RecipeArg,
    SkipPreflightOpt,
    load_or_exit,
    pilot_calibration,
    target_facts,
)


def command(
    recipe: RecipeArg,
    overrides: OverridesArg = None,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Default: <storage.root>/<recipe name>.")] = None,
    only: Annotated[str | None, typer.Option("--only", help="Run just this stage.")] = None,
    until: Annotated[str | None, typer.Option("--until", help="Run the stages up to and including this one.")] = None,
    force: Annotated[list[str] | None, typer.Option("--force",
                                                    help="Re-run this stage even if done (repeatable).")] = None,
    skip_preflight: SkipPreflightOpt = False,
    skip_pilot: Annotated[bool, typer.Option("--skip-pilot",
                                             help="Do not run the pilot first (pilot.enabled).")] = False,
    continue_over_budget: ContinueOpt = False,
    node_rank: Annotated[int | None, typer.Option(
        "--node-rank", min=0, help="This machine's node of a multi-node profile (sets DFLASHX_NODE_RANK): "
        "it starts only its own generation servers; node 0 drives (docs/running.md).")] = None,
) -> None:
    from dflashx.cli.view import SessionConsole, stopped
    from dflashx.track.output import terminal

    if node_rank is not None:
        from dflashx.backends.nodes import NODE_RANK_ENV

        os.environ[NODE_RANK_ENV] = str(node_rank)  # read where servers start (backends.nodes.node_rank)

    with terminal() as stream, SessionConsole(file=stream) as view, view.route_logs():
        view.line(f"dflashx run {recipe}: planning…")  # before the heavy imports: a line at once
        from dflashx.report.progress import write_progress
        from dflashx.run.graph import select
        from dflashx.run.session import RunRequest, Stopped, run_recipe

        overrides = overrides or []
        loaded = load_or_exit(recipe, overrides)
        try:
            selection = select(only, until, force or [])
        except ValueError as e:
            typer.echo(str(e), err=True)
            raise typer.Exit(2) from None
        request = RunRequest(loaded.recipe, recipe, target_facts(loaded.recipe),
                             pilot_calibration(loaded.recipe, run_dir), run_dir, selection,
                             preflight=not skip_preflight, pilot=not skip_pilot,
                             continue_over_budget=continue_over_budget, argv=sys.argv)
        try:
            session = run_recipe(request, view, on_progress=write_progress)
        except Stopped as stop:
            raise stopped(view, stop) from None
        others = [o for o in overrides if o.split("=")[0] not in ("train.lr", "stages.train.lr")]
        retrain = (None if session.retrain_lr is None
                   else _command(recipe, [*others, f"train.lr={session.retrain_lr:g}"], run_dir))
        view.summary(session.result, _command(recipe, overrides, run_dir), retrain)
        if not session.ok:
            typer.echo(f"stopped; see `dflashx status {session.run_dir}`", err=True)
            raise typer.Exit(1)
        view.line(f"all selected stages done; see `dflashx status {session.run_dir}`")


def _command(recipe: Path, overrides: list[str], run_dir: Path | None) -> str:
    return shlex.join(["dflashx", "run", str(recipe), *overrides, *(["--run-dir", str(run_dir)] if run_dir else [])])
