"""`dflashx pilot RECIPE [OVERRIDES...] [--run-dir DIR] [--continue-over-budget] [--skip-preflight]`.

Plans the recipe (exit 1 on plan errors), runs the preflight for the stages the pilot uses, runs the
pilot (`dflashx.run.pilot`), prints the plan's figures against the measured ones and the plan before
and after, and exits 1 when the re-plan breaks `budget.*` (`--continue-over-budget`: exit 0): all
`dflashx.run.session.pilot_recipe`; this command parses, calls and prints. `dflashx run` runs the
same pilot first on a GPU profile.
"""

from __future__ import annotations

import sys

from dflashx.cli._common import (
    ContinueOpt,
    OverridesArg,
    RecipeArg,
    RunDirOpt,
    SkipPreflightOpt,
    load_or_exit,
    pilot_calibration,
    target_facts,
)


def command(recipe: RecipeArg, overrides: OverridesArg = None, run_dir: RunDirOpt = None,
            continue_over_budget: ContinueOpt = False, skip_preflight: SkipPreflightOpt = False) -> None:
    from dflashx.cli.view import SessionConsole, stopped
    from dflashx.track.output import terminal

    with terminal() as stream, SessionConsole(file=stream) as view, view.route_logs():
        view.line(f"dflashx pilot {recipe}: planning…")
        from dflashx.run.session import RunRequest, Stopped, pilot_recipe

        loaded = load_or_exit(recipe, overrides)
        request = RunRequest(loaded.recipe, recipe, target_facts(loaded.recipe),
                             pilot_calibration(loaded.recipe, run_dir), run_dir, preflight=not skip_preflight,
                             continue_over_budget=continue_over_budget, argv=sys.argv)
        try:
            pilot_recipe(request, view)
        except Stopped as stop:
            raise stopped(view, stop) from None
