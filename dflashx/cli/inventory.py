"""`dflashx inventory RUN_DIR`: every artifact of a run, its tier, size, where it is, checksums."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

RunDirArg = Annotated[Path, typer.Argument(exists=True, file_okay=False, help="The run directory.")]
ToOpt = Annotated[str | None, typer.Option("--to", help="A remote folder instead of storage.s3.")]


def command(
    run_dir: RunDirArg,
    to: ToOpt = None,
    rehash: Annotated[bool, typer.Option("--rehash", help="Re-hash local files (default: sizes only).")] = False,
    local_only: Annotated[bool, typer.Option("--local-only", help="Do not contact the remote.")] = False,
) -> None:
    from dflashx.cli._common import make_console
    from rich.table import Table

    from dflashx.report.fmt import human_bytes
    from dflashx.store.base import StoreError
    from dflashx.store.inventory import build_inventory, run_remote

    console = make_console()
    try:
        store = None if local_only else run_remote(run_dir, to)
        if store is not None:
            store.check_access()
    except StoreError as exc:
        console.print(f"[yellow]remote not checked:[/yellow] {exc}")
        store = None
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    inv = build_inventory(run_dir, store, rehash=rehash)
    table = Table(title=f"{run_dir} -> {inv.remote or 'no remote configured'}")
    for col in ("artifact", "stage", "tier", "size", "files", "where", "local", "remote", "verified"):
        table.add_column(col, justify="right" if col in ("size", "files") else "left",
                         no_wrap=col == "artifact")
    for r in inv.rows:
        table.add_row(r.name, r.stage, r.tier, human_bytes(r.size), str(r.files), r.where, r.local,
                      r.remote, r.verified_at or "-")
    console.print(table)
    totals = Table(title="totals per tier")
    for col in ("tier", "artifacts", "size", "local", "remote"):
        totals.add_column(col, justify="left" if col == "tier" else "right")
    for tier, t in inv.totals.items():
        totals.add_row(tier, str(t["artifacts"]), human_bytes(t["bytes"]),
                       human_bytes(t["local_bytes"]), human_bytes(t["remote_bytes"]))
    console.print(totals)
