"""`dflashx schema`: the JSON Schema of recipe files, for editors (e.g. yaml-language-server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from dflashx.config.schema import recipe_json_schema
from dflashx.store.atomic import atomic_open


def command(
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write to this file instead of stdout.")] = None,
) -> None:
    text = json.dumps(recipe_json_schema(), indent=2) + "\n"
    if out is None:
        typer.echo(text, nl=False)
        return
    with atomic_open(out) as fh:
        fh.write(text)
    typer.echo(f"wrote {out}", err=True)
