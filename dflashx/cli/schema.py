"""`dflashx schema`: the JSON Schema of recipe files, for editors (e.g. yaml-language-server)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from dflashx.config.schema import recipe_json_schema


def command(
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write to this file instead of stdout.")] = None,
) -> None:
    text = json.dumps(recipe_json_schema(), indent=2) + "\n"
    if out is None:
        typer.echo(text, nl=False)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, out)
    typer.echo(f"wrote {out}", err=True)
