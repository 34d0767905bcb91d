"""`dflashx backup RUN_DIR`: copy the run to S3 (or --to a folder), verify, say if it is safe."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dflashx.cli.inventory import RunDirArg, ToOpt


def command(
    run_dir: RunDirArg,
    to: ToOpt = None,
    only_irreplaceable: Annotated[
        bool, typer.Option("--only-irreplaceable", help="Skip replaceable artifacts.")] = False,
    verify_only: Annotated[
        bool, typer.Option("--verify-only", help="Upload nothing; verify the remote copies.")] = False,
    repair: Annotated[
        bool, typer.Option("--repair", help="Upload again remote copies that fail verification.")] = False,
) -> None:
    from dflashx.cli._common import make_console
    from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

    from dflashx.report.fmt import human_bytes
    from dflashx.report.progress import write_progress
    from dflashx.run.status import NotARunDir
    from dflashx.store.backup import SAFE, backup_run
    from dflashx.store.base import StoreError
    from dflashx.store.inventory import run_remote

    console = make_console()

    def refresh_progress(path: Path) -> None:
        """PROGRESS.md before the run's own files are sent; a plan.json this dflashx cannot read (a run
        made before a schema change) only warns: the backup goes on and sends the run's files."""
        try:
            write_progress(path)
        except NotARunDir as exc:
            console.print(f"warning: {path}/PROGRESS.md not refreshed: {exc}; the run's own files "
                          "(plan.json, recipe.yaml, records) are still backed up", style="yellow", markup=False)
    try:
        store = run_remote(run_dir, to)
        if store is None:
            console.print(f"[red]error:[/red] {run_dir}/recipe.yaml has no storage.s3: set "
                          "storage.s3 in the recipe or pass --to FOLDER")
            raise typer.Exit(1)
        with Progress(*Progress.get_default_columns(), DownloadColumn(), TransferSpeedColumn(),
                      console=console, transient=True) as bar:
            task = bar.add_task("uploading", total=None)
            report = backup_run(run_dir, store, include_replaceable=not only_irreplaceable,
                                verify_only=verify_only, repair=repair,
                                progress=lambda n: bar.advance(task, n),
                                before_run_files=refresh_progress)
    except StoreError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    console.print(f"{len(report.files)} file(s), {human_bytes(report.bytes_verified)} verified at "
                  f"{report.remote}; {human_bytes(report.bytes_uploaded)} uploaded")
    if report.garbage:
        total = human_bytes(sum(g["size"] for g in report.garbage))
        console.print(f"garbage, not copied ({total}; `dflashx gc {run_dir}` deletes it):")
        for g in report.garbage:
            console.print(f"  {g['name']}  {g['path']}  {human_bytes(g['size'])}")
    if not report.ok:
        console.print(f"[red]do not shut down yet:[/red] {len(report.problems)} file(s) not verified:")
        for p in report.problems:
            console.print(f"  {p.status:13s} {p.rel}  {p.detail}")
        raise typer.Exit(1)
    console.print(f"[green]{SAFE}[/green]: every copy verified by sha256")
