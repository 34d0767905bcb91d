"""QC stage: judge `generate.completions` before anything expensive; raise StageFailed when bad.

Writes `report/` (report.md, qc.json, PNG histograms) in the stage folder either way, so a failed
run leaves its evidence next to the plain-words message. The report names its input by its path
relative to the run folder, so two runs on the same completions write identical reports.
"""

from __future__ import annotations

from pathlib import Path

from dflashx.data.qc_checks import run_qc
from dflashx.data.qc_report import write_report
from dflashx.stages.base import Artifact, QCContext, StageFailed, StageResult
from dflashx.stages.graph import input_name
from dflashx.targets.locate import locate_tokenizer

REPORT_DIR = "report"
INPUT = input_name("qc")


def _input_label(ctx: QCContext, name: str) -> str:
    """The input `name` as the report shows it: its run-relative posix path, else its dotted name."""
    try:
        return Path(ctx.inputs[name]).resolve().relative_to(Path(ctx.run_dir).resolve()).as_posix()
    except ValueError:
        return name


def run(ctx: QCContext) -> StageResult:
    cfg = ctx.config
    target = ctx.recipe.target
    result = run_qc(
        ctx.inputs[INPUT], cfg.thresholds, tokenizer_path=locate_tokenizer(target),
        enable_thinking=target.chat_template.enable_thinking, template_kwargs=target.chat_template.kwargs,
        mask_sample=cfg.mask_sample,
    )
    report = ctx.out_dir / REPORT_DIR
    write_report(result, report, cfg.thresholds.mask_spike_max_tokens, source=_input_label(ctx, INPUT))
    metrics = result.metrics()
    ctx.log({f"qc/{k}": v for k, v in metrics.items()})
    if not result.passed:
        raise StageFailed(f"{result.message()}\nReport: {report / 'report.md'}", metrics)
    return StageResult(
        artifacts={"report": Artifact(REPORT_DIR, description="QC verdicts, qc.json and histograms")},
        metrics=metrics,
    )
