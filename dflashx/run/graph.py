"""The stage graph: what each stage reads, which recipe keys decide its output, and which stages a
`dflashx run` invocation selects (--only / --until / --force)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from dflashx.config.schema import STAGE_ORDER


@dataclass(frozen=True)
class StageSpec:
    """`inputs`: required artifacts (dotted names); `optional_inputs`: used when present;
    `sections`: dotted keys of the resolved recipe that decide the output (the stage key);
    `ignore`: dotted keys under those sections that do not change the output (operational knobs);
    `paths`: dotted keys holding local paths, keyed by content fingerprint instead of path text
    (`[]` means every item of a list)."""

    inputs: tuple[str, ...] = ()
    optional_inputs: tuple[str, ...] = ()
    sections: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    all_inputs: bool = False  # backup: every live artifact of the other stages


_TARGET = ("target.model", "target.tokenizer", "target.precision", "target.chat_template")
_TARGET_PATHS = ("target.model", "target.tokenizer")

GRAPH: dict[str, StageSpec] = {
    "ingest": StageSpec(
        sections=("dataset.sources", "dataset.dedupe", "dataset.shuffle_seed", "dataset.eval_holdout",
                  "stages.ingest"),
        paths=("dataset.sources[].path",),
    ),
    # Not hardware: moving to another node or serving layout must never regenerate.
    "generate": StageSpec(
        inputs=("ingest.prompts",),
        sections=(*_TARGET, "stages.generate"),
        ignore=("stages.generate.urls", "stages.generate.concurrency", "stages.generate.request_timeout_s",
                "stages.generate.retries", "stages.generate.flush_every", "stages.generate.batch_size",
                "stages.generate.hierarchical_cache", "stages.generate.server_startup_timeout_s",
                "stages.generate.retry_backoff_s", "stages.generate.shard_size"),
        paths=_TARGET_PATHS,
    ),
    "qc": StageSpec(inputs=("generate.completions",), sections=(*_TARGET, "drafter.block_size", "stages.qc"),
                    paths=_TARGET_PATHS),
    "tokenize": StageSpec(
        inputs=("generate.completions",),
        sections=(*_TARGET, "drafter.block_size", "stages.tokenize"),
        ignore=("stages.tokenize.num_proc",),
        paths=_TARGET_PATHS,
    ),
    # micro batch, ZeRO stage and grad accumulation follow the hardware; the global batch is the recipe's.
    "train": StageSpec(
        inputs=("tokenize.dataset",),
        sections=(*_TARGET, "drafter", "stages.train"),
        ignore=("stages.train.micro_batch", "stages.train.zero_stage", "stages.train.grad_accum",
                "stages.train.log_every"),
        paths=(*_TARGET_PATHS, "drafter.init_from"),
    ),
    "eval": StageSpec(
        inputs=("train.checkpoint",), optional_inputs=("ingest.eval_prompts",),
        sections=(*_TARGET, "drafter", "stages.eval"),
        paths=(*_TARGET_PATHS, "stages.eval.prompts"),
    ),
    "export": StageSpec(inputs=("train.checkpoint",), sections=("drafter", "stages.export")),
    "backup": StageSpec(sections=("stages.backup", "storage.s3"), all_inputs=True),
}


@dataclass
class Selection:
    """Which stages to consider this invocation, and which to re-run even when done."""

    stages: list[str] = field(default_factory=list)
    force: set[str] = field(default_factory=set)


def _check(name: str, flag: str) -> None:
    if name not in STAGE_ORDER:
        close = difflib.get_close_matches(name, STAGE_ORDER, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{flag} {name!r}: unknown stage{hint}; stages are {', '.join(STAGE_ORDER)}")


def select(only: str | None = None, until: str | None = None, force: tuple[str, ...] | list[str] = ()) -> Selection:
    """Stages in pipeline order: all, `--only` one, or up to and including `--until`."""
    if only and until:
        raise ValueError("give --only or --until, not both")
    for flag, name in (("--only", only), ("--until", until), *(("--force", f) for f in force)):
        if name:
            _check(name, flag)
    if only:
        stages = [only]
    elif until:
        stages = list(STAGE_ORDER[: STAGE_ORDER.index(until) + 1])
    else:
        stages = list(STAGE_ORDER)
    outside = [f for f in force if f not in stages]
    if outside:
        raise ValueError(f"--force {', '.join(outside)}: not among the stages this run selects ({', '.join(stages)})")
    return Selection(stages=stages, force=set(force))
