"""`dflashx review BASE HEAD`: markdown for a pull request changing a recipe.

BASE/HEAD are recipe files or `path@gitref`, e.g. `dflashx review recipes/a.yaml@origin/main
recipes/a.yaml`. Exit 1 when the head recipe does not load or its plan has errors, 2 when a
git ref does not resolve (a path missing at a valid ref is a new or deleted recipe).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def command(
    base: Annotated[str, typer.Argument(help="Base recipe: a file, or path@gitref.")],
    head: Annotated[str, typer.Argument(help="Head recipe: a file, or path@gitref.")],
    out: Annotated[Path | None, typer.Option("--out", help="Also write the markdown to this file.")] = None,
) -> None:
    import tempfile

    from dflashx.cli._common import target_facts
    from dflashx.report.review import RefError, review
    from dflashx.store.manifest import atomic_write_text

    with tempfile.TemporaryDirectory(prefix="dflashx-review-") as tmp:
        try:
            markdown, ok = review(base, head, target_facts, Path(tmp))
        except RefError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
    typer.echo(markdown)
    if out is not None:
        atomic_write_text(out, markdown)
    if not ok:
        raise typer.Exit(1)
