"""`dflashx status RUN_DIR`: each stage's state, key, duration, outputs and headline metrics (a failed
stage's error; what a running stage waits on, when it says; where an unfinished one stopped)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

HEADLINE_METRICS = 4
STATE_STYLE = {"done": "green", "failed": "red", "running": "cyan", "interrupted": "yellow", "unfinished": "yellow",
               "stale": "yellow", "pending": "white", "skipped-disabled": "dim"}


def _headline(metrics: dict[str, Any]) -> str:
    from dflashx.report.fmt import human_value

    scalars = [(k, v) for k, v in metrics.items() if isinstance(v, (int, float, str, bool)) and len(str(v)) < 40]
    return ", ".join(f"{k}={human_value(v)}" for k, v in scalars[:HEADLINE_METRICS])


def command(run_dir: Annotated[Path, typer.Argument(help="A run directory made by `dflashx run`.")]) -> None:
    from dflashx.cli._common import make_console
    from rich.table import Table

    from dflashx.report.fmt import human_bytes, human_seconds
    from dflashx.run.status import NotARunDir, run_status

    try:
        rows = run_status(run_dir)
    except NotARunDir as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    table = Table(title=f"dflashx run {run_dir}")
    for column in ("stage", "state", "key", "duration", "outputs", "headline"):
        table.add_column(column)
    for row in rows:
        outputs = "\n".join(f"{e.artifact} ({human_bytes(e.size)})" for e in row.outputs)
        said = row.state in ("failed", "running", "unfinished") and row.message
        headline = row.message if said else _headline(row.metrics)
        style = STATE_STYLE.get(row.state, "white")
        table.add_row(row.name, f"[{style}]{row.state}[/]", (row.stage_key or "")[:12],
                      human_seconds(row.duration_s), outputs or "-", headline or "-")
    make_console().print(table)
