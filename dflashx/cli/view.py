"""What `dflashx run` and `dflashx pilot` print while `dflashx.run.session` works: the run's live
view (`dflashx.report.console.RunConsole`) plus the session's other output (`SessionView`): the
plan's findings and the preflight's problems on stderr, the pilot's figures as tables; `stopped`
prints a `Stopped` and returns the exit to raise."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import typer

from dflashx.cli._common import format_finding, make_console
from dflashx.cli.preflight import echo_problems
from dflashx.report.console import RunConsole
from dflashx.report.pilot import sections

if TYPE_CHECKING:
    from dflashx.plan.findings import Finding
    from dflashx.run.check import Check
    from dflashx.run.pilot import PilotOutcome
    from dflashx.run.session import Stopped


class SessionConsole(RunConsole):
    """A `SessionView` on the terminal."""

    def findings(self, findings: Sequence[Finding]) -> None:
        for finding in findings:
            typer.echo(format_finding(finding), err=True)

    def preflight(self, checks: Sequence[Check]) -> None:
        def echo(text: str, err: bool = False) -> None:
            if err:
                typer.echo(text, err=True)
            else:
                self.line(text)

        echo_problems(list(checks), echo)

    def pilot_measured(self, outcome: PilotOutcome) -> None:
        console = make_console(file=self.console.file)
        for section in sections(outcome):
            console.print(section.rich())


def stopped(view: RunConsole, stop: Stopped) -> typer.Exit:
    """Stop the live rows, print why the session stopped (and the findings behind it) on stderr."""
    view.close(interrupted=stop.interrupted)
    typer.echo("\n".join([stop.message, *(format_finding(f) for f in stop.findings)]), err=True)
    return typer.Exit(stop.exit_code)
