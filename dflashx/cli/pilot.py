"""`dflashx pilot RECIPE [OVERRIDES...] [--run-dir DIR] [--continue-over-budget] [--skip-preflight]`.

Plans the recipe (exit 1 on plan errors), runs the preflight for the stages the pilot uses, runs the
pilot (`dflashx.run.pilot`), prints the plan's figures against the measured ones and the plan before
and after, and exits 1 when the re-plan breaks `budget.*` (`--continue-over-budget`: exit 0).
`dflashx run` calls `pilot_or_exit` first on a GPU profile.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dflashx.cli._common import (
    OverridesArg,
    RecipeArg,
    RunDirOpt,
    format_finding,
    load_or_exit,
    make_console,
    pilot_calibration,
    target_facts,
)

if TYPE_CHECKING:
    from dflashx.config.schema import Recipe
    from dflashx.plan.plan import Plan
    from dflashx.report.console import RunConsole

ContinueOpt = Annotated[bool, typer.Option(
    "--continue-over-budget", help="Go on when the pilot's re-plan breaks budget.* (the numbers are printed).")]
SkipPreflightOpt = Annotated[bool, typer.Option("--skip-preflight", help="Start without the preflight checks.")]
PILOT_STAGES = ["ingest", "generate", "tokenize", "train"]


def preflight_or_exit(view: RunConsole, recipe: Path, resolved: Any, plan: dict[str, Any], target: Path,
                      stages: list[str], force: set[str]) -> None:
    """The preflight checks for `stages`: problems to the view (failures to stderr), exit 1 on a failure."""
    from dflashx.cli.preflight import echo_problems, failures
    from dflashx.run.preflight import preflight, stages_to_check

    view.line("preflight: checking the data, target, tokenizer, disk and servers…")
    checks = preflight(resolved, plan, target, stages_to_check(resolved, target, stages, force))

    def echo(text: str, err: bool = False) -> None:
        if err:
            typer.echo(text, err=True)
        else:
            view.line(text)

    echo_problems(checks, echo)
    if failures(checks):
        typer.echo(f"{recipe}: the preflight failed; nothing was run (fix the above, or --skip-preflight)", err=True)
        raise typer.Exit(1)


def pilot_or_exit(view: RunConsole, recipe: Recipe, facts: Any, target: Path, continue_over_budget: bool) -> Plan:
    """Run the pilot, print what it measured; the re-plan, or exit 1 when the pilot failed or (without
    `continue_over_budget`) the re-plan breaks the budget."""
    from dflashx.report.pilot import BUDGET_CODES, budget_breaks, sections
    from dflashx.run.pilot import PilotFailed, run_pilot
    from dflashx.run.rundir import RunDirBusy

    view.line(f"pilot: {recipe.pilot.prompts} prompts, {recipe.pilot.train_steps} training steps "
              f"(pilot.* in the recipe), to measure what the plan assumed")
    try:
        outcome = run_pilot(recipe, facts, target, view, sys.argv)
    except (PilotFailed, RunDirBusy) as e:
        view.close()
        typer.echo(f"pilot: {e}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        view.close(interrupted=True)
        typer.echo("interrupted: the completions written are kept; the pilot (or the run) continues after them",
                   err=True)
        raise typer.Exit(130) from None
    console = make_console(file=view.console.file)
    for section in sections(outcome):
        console.print(section.rich())
    others = [f for f in outcome.after.errors if f.code not in BUDGET_CODES]
    if others:
        lines = "\n".join(format_finding(f.to_json()) for f in others)
        typer.echo(f"stopped: with the pilot's figures the plan has errors:\n{lines}", err=True)
        raise typer.Exit(1)
    breaks = budget_breaks(outcome.after)
    if breaks:
        lines = "\n".join(f"  {b}" for b in breaks)
        if not continue_over_budget:
            typer.echo(f"stopped: with the pilot's figures the plan breaks the budget:\n{lines}\n"
                       "raise budget.*, change the recipe, or run again with --continue-over-budget", err=True)
            raise typer.Exit(1)
        view.line(f"over budget, continuing (--continue-over-budget):\n{lines}")
    view.line(f"pilot: wrote {outcome.path}; `dflashx plan` of this recipe now uses it")
    return outcome.after


def command(recipe: RecipeArg, overrides: OverridesArg = None, run_dir: RunDirOpt = None,
            continue_over_budget: ContinueOpt = False, skip_preflight: SkipPreflightOpt = False) -> None:
    from dflashx.plan.plan import make_plan
    from dflashx.report.console import RunConsole
    from dflashx.run.layout import default_run_dir
    from dflashx.track.output import terminal

    with terminal() as stream, RunConsole(file=stream) as view, view.route_logs():
        view.line(f"dflashx pilot {recipe}: planning…")
        loaded = load_or_exit(recipe, overrides)
        facts = target_facts(loaded.recipe)
        made = make_plan(loaded.recipe, facts, pilot_calibration(loaded.recipe, run_dir))
        plan = made.to_json()
        for finding in plan["errors"]:
            typer.echo(format_finding(finding), err=True)
        if made.resolved is None or plan["errors"]:
            typer.echo(f"{recipe}: the plan has {len(plan['errors'])} error(s); no pilot was run", err=True)
            raise typer.Exit(1)
        target = run_dir or default_run_dir(made.resolved)
        view.line(f"run dir: {target}")
        if not skip_preflight:
            preflight_or_exit(view, recipe, made.resolved, plan, target, PILOT_STAGES, set())
        pilot_or_exit(view, loaded.recipe, facts, target, continue_over_budget)
