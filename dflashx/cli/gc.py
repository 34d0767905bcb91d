"""`dflashx gc RUN_DIR [--yes]`: delete a run's garbage artifacts after a confirmation."""

from __future__ import annotations

from typing import Annotated

import typer

from dflashx.cli.inventory import RunDirArg, ToOpt


def command(
    run_dir: RunDirArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking.")] = False,
    remote: Annotated[bool, typer.Option("--remote", help="Also delete remote copies of the garbage.")] = False,
    to: ToOpt = None,
) -> None:
    from dflashx.cli._common import make_console

    from dflashx.report.fmt import human_bytes
    from dflashx.store.base import StoreError
    from dflashx.store.inventory import collect_garbage, run_remote
    from dflashx.store.manifest import Manifest

    console = make_console()
    garbage = [e for e in Manifest.load(run_dir).entries.values() if e.tier == "garbage"]
    if not garbage:
        console.print("no garbage in this run")
        return
    for e in garbage:
        console.print(f"  {e.name}  {e.path}  {human_bytes(e.size)}")
    total = human_bytes(sum(e.size for e in garbage))
    where = "locally and remotely" if remote else "locally"
    if not yes and not typer.confirm(f"Delete these {len(garbage)} artifact(s), {total}, {where}?"):
        console.print("nothing deleted")
        raise typer.Exit(1)
    try:
        deleted = collect_garbage(run_dir, run_remote(run_dir, to) if remote else None)
    except StoreError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    console.print(f"deleted {len(deleted)} artifact(s), {total} freed")
