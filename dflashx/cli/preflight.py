"""`dflashx preflight RECIPE [OVERRIDES...] [--run-dir DIR] [--json]`: check the world before a run.

Loads and plans the recipe (exit 2 when it cannot be read), runs `dflashx.run.preflight` and prints a
table of check / status / detail / fix, or exactly one JSON object with `--json`. Exit 1 when a check
fails. `dflashx run` calls the same checks first (`echo_problems`).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dflashx.cli._common import OverridesArg, RecipeArg, load_or_exit, make_console, target_facts

if TYPE_CHECKING:
    from collections.abc import Callable

    from dflashx.run.preflight import Check

STYLE = {"ok": "green", "warn": "yellow", "fail": "red"}


def failures(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.status == "fail"]


def render(checks: list[Check], title: str) -> None:
    """The table, then the verdict line."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, show_lines=True)
    for col in ("check", "status", "message", "fix"):
        table.add_column(col, overflow="fold")
    for c in checks:
        table.add_row(escape(c.code), f"[{STYLE[c.status]}]{c.status}", escape(c.message), escape(c.fix))
    console = make_console()
    console.print(table)
    console.print(f"[{'red' if failures(checks) else 'green'}]{verdict(checks)}")


def verdict(checks: list[Check]) -> str:
    count = {s: sum(c.status == s for c in checks) for s in STYLE}
    return f"preflight: {count['fail']} failed, {count['warn']} warning(s), {count['ok']} ok"


def echo_problems(checks: list[Check], echo: Callable[..., None]) -> None:
    """One line per failed or warning check and its fix (what `dflashx run` prints), then the verdict."""
    for c in checks:
        if c.status != "ok":
            echo(f"preflight {c.status} [{c.code}] {c.message}" + (f"\n    fix: {c.fix}" if c.fix else ""), err=True)
    echo(verdict(checks), err=bool(failures(checks)))


def command(
    recipe: RecipeArg,
    overrides: OverridesArg = None,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Default: <storage.root>/<recipe name>.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print exactly one JSON object (for CI).")] = False,
) -> None:
    from dflashx.plan.plan import make_plan
    from dflashx.run.layout import default_run_dir
    from dflashx.run.preflight import check_plan, preflight

    loaded = load_or_exit(recipe, overrides)
    made = make_plan(loaded.recipe, target_facts(loaded.recipe))
    checked = made.resolved or loaded.recipe
    checks = [check_plan(made), *preflight(checked, made, run_dir or default_run_dir(checked))]
    if json_out:
        typer.echo(json.dumps({"recipe": str(recipe), "ok": not failures(checks),
                               "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        render(checks, f"preflight: {recipe}")
    if failures(checks):
        raise typer.Exit(1)
