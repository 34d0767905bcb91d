"""`dflashx target`: build the built-in tiny target, and show what a model folder holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)


@app.command("build-tiny")
def build_tiny(
    variant: Annotated[str, typer.Option(
        help="tiny-qwen3 (all full attention) or tiny-qwen3_5 (Gated DeltaNet hybrid).")] = "tiny-qwen3",
    out: Annotated[Optional[Path], typer.Option(help="Build into this folder instead of the cache.")] = None,
    small: Annotated[bool, typer.Option(help="The small CI size (well under a minute, format only).")] = False,
    rebuild: Annotated[bool, typer.Option(
        help="Build from the code even when the cache or the package holds it.")] = False,
) -> None:
    """Build (or find in the cache or the package) the tiny thinking target; prints its folder last."""
    import shutil

    from dflashx.tiny.build import VARIANTS, ensure_tiny_target, target_dir

    if variant not in VARIANTS:  # the trained builds (builtin:tiny-qwen3_moe is upcycled on first use)
        typer.echo(f"--variant {variant!r} is unknown; choose one of {', '.join(VARIANTS)}", err=True)
        raise typer.Exit(2)
    if rebuild and out is None:
        shutil.rmtree(target_dir(variant, small), ignore_errors=True)
    try:
        path = ensure_tiny_target(variant, small=small, out=out, log=lambda m: typer.echo(m, err=True),
                                  shipped=not rebuild)
    except FileExistsError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    _print_report(path)
    typer.echo(str(path))


@app.command("info")
def info(
    path: Annotated[str, typer.Argument(help="Model folder or builtin:tiny-qwen3 / builtin:tiny-qwen3_5.")],
) -> None:
    """Architecture facts of a model folder (and its build report, for a tiny target)."""
    from dflashx.targets.read_config import ConfigFactsError, facts_from_config

    folder = Path(path)
    if path.startswith("builtin:"):
        from dflashx.tiny import locate_builtin

        folder = locate_builtin(path)
    config = folder / "config.json"
    if not config.is_file():
        typer.echo(f"{config} does not exist; give a Hugging Face model folder", err=True)
        raise typer.Exit(2)
    try:
        facts = facts_from_config(json.loads(config.read_text(encoding="utf-8")), name=str(folder))
    except (ConfigFactsError, json.JSONDecodeError) as exc:
        typer.echo(f"{config}: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps(facts.model_dump(mode="json"), indent=2))
    _print_report(folder)


def _print_report(folder: Path) -> None:
    report = folder / "build_report.json"
    if not report.is_file():
        return
    data = json.loads(report.read_text())
    typer.echo(f"tiny target {data['settings']['variant']}: {data['params'] / 1e6:.2f}M params, "
               f"built in {data['build_seconds']:.0f}s, mask token id {data['mask_token_id']}")
    for mode in ("eval_thinking", "eval_no_thinking"):
        rows = data[mode]["per_family"]
        cells = ", ".join(f"{fam} {r['accuracy']:.0%}" for fam, r in rows.items())
        overall = data[mode]["overall"]
        typer.echo(f"  {mode}: accuracy {overall['accuracy']:.0%} ({cells}); well-formed {overall['well_formed']:.0%}")
