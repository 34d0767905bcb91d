"""`dflashx compare RUN...`: runs side by side (recipe differences, estimate vs actual, results)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

RunsArg = Annotated[list[Path], typer.Argument(exists=True, file_okay=False, help="Run directories.")]


def command(
    runs: RunsArg,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print markdown instead of tables.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    from dflashx.cli._common import make_console

    from dflashx.report.compare import compare
    from dflashx.report.runinfo import RunInfo

    try:
        infos = [RunInfo.load(r) for r in runs]
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    sections = compare(infos)
    if as_json:
        typer.echo(json.dumps({"sections": [s.to_json() for s in sections]}, indent=1))
    elif markdown:
        typer.echo("\n".join(s.markdown() for s in sections))
    else:
        console = make_console()
        for section in sections:
            console.print(section.rich())
