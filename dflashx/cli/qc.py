"""`dflashx qc PATH`: run the QC gate alone (exit 0 pass, 1 fail, 2 bad input)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

PathArg = Annotated[Path, typer.Argument(
    help="The generate stage's completions folder, a tokenized dataset folder, or chat JSONL.",
    show_default=False,
)]


def command(
    path: PathArg,
    tokenizer: Annotated[Optional[Path], typer.Option(
        help="Tokenizer folder: loss-mask sizes in tokens (default: the recipe's target, else words).")] = None,
    recipe: Annotated[Optional[Path], typer.Option(
        help="Recipe whose stages.qc thresholds and target chat template apply.")] = None,
    enable_thinking: Annotated[Optional[bool], typer.Option(
        "--enable-thinking/--no-enable-thinking",
        help="Was thinking requested? (default: the recipe's, else on)")] = None,
    out: Annotated[Optional[Path], typer.Option(
        help="Write report.md, qc.json and histograms into this folder.")] = None,
) -> None:
    from dflashx.cli._common import load_or_exit
    from dflashx.config.schema import QCStage
    from dflashx.data.chat_mask import ChatTemplateError
    from dflashx.data.qc_checks import run_qc
    from dflashx.data.qc_inputs import QCInputError
    from dflashx.data.qc_report import write_report

    cfg, kwargs = QCStage(), {}
    if recipe is not None:
        loaded = load_or_exit(recipe).recipe
        cfg, kwargs = loaded.stages.qc, loaded.target.chat_template.kwargs
        enable_thinking = loaded.target.chat_template.enable_thinking if enable_thinking is None else enable_thinking
        if tokenizer is None:
            from dflashx.targets.locate import locate_tokenizer

            tokenizer = locate_tokenizer(loaded.target)
    try:
        result = run_qc(path, cfg.thresholds, tokenizer_path=tokenizer,
                        enable_thinking=True if enable_thinking is None else enable_thinking,
                        template_kwargs=kwargs, mask_sample=cfg.mask_sample)
    except (QCInputError, ChatTemplateError, FileNotFoundError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"note: {result.unit_note}")
    for check in result.checks:
        state = "skip" if check.skipped else ("ok  " if check.passed else "FAIL")
        typer.echo(f"  [{state}] {check.line()}")
    if out is not None:
        write_report(result, out, cfg.thresholds.mask_spike_max_tokens)
        typer.echo(f"report: {out / 'report.md'}")
    typer.echo(result.message().splitlines()[0] if result.passed else result.message(), err=not result.passed)
    raise typer.Exit(0 if result.passed else 1)
