"""`dflashx calibrate RUN... [--write]`: fit the planner's efficiency factors from finished runs."""

from __future__ import annotations

from typing import Annotated

import typer

from dflashx.cli.compare import RunsArg

WriteOpt = Annotated[bool, typer.Option("--write", help="Write hardware_profiles/<profile>.calibration.yaml.")]


def command(runs: RunsArg, write: WriteOpt = False) -> None:

    from dflashx.cli._common import make_console, target_facts
    from dflashx.report.calibrate import calibrate, write_calibration
    from dflashx.report.runinfo import RunInfo

    console = make_console()
    try:
        infos = [RunInfo.load(r) for r in runs]
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    result = calibrate(infos, target_facts)
    for section in result.sections():
        console.print(section.rich())
    if not result.fits:
        typer.echo("nothing to calibrate: no run measured generation throughput or training MFU", err=True)
        raise typer.Exit(1)
    if not write:
        console.print("dry run: add --write to save these factors")
        return
    names = [i.name for i in infos]
    for profile, factors in result.factors.items():
        try:
            path = write_calibration(profile, factors, names)
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        console.print(f"wrote {path}; `dflashx plan` now marks {', '.join(factors)} as calibrated")
