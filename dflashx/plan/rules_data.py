"""Rules about the data the money is spent on: thinking mode, truncation, dataset size, and the
recipe's `acknowledge` list. The costly mistakes are `blocking`: `dflashx run` stops before the
first stage unless the recipe acknowledges the code (see `findings.acknowledged`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from dflashx.config.suggest import did_you_mean
from dflashx.plan.context import PlanContext
from dflashx.plan.estimates.lengths import Lengths
from dflashx.plan.findings import Finding, blocking, error, warning

Rule = Callable[[PlanContext], Iterable[Finding]]
BLOCKING_CODES = ("thinking_off", "generate_truncation", "train_truncation")


def thinking_on(ctx: PlanContext) -> Iterable[Finding]:
    if not ctx.recipe.target.chat_template.enable_thinking and ctx.facts.thinking:
        yield blocking("thinking_off", "target.chat_template.enable_thinking",
                       f"thinking is off for {ctx.facts.name}, a thinking target: the drafter learns answers "
                       "without reasoning, while the served target spends most tokens reasoning (the seeds "
                       "regenerated 1.64B tokens over this)",
                       "set target.chat_template.enable_thinking=true, unless the target is served with thinking off")


def _share(value: float) -> str:
    return f"{value:.0%}" if value >= 0.01 else f"{value:.1%}"


def generation_not_truncated(ctx: PlanContext) -> Iterable[Finding]:
    gen, limit = ctx.recipe.stages.generate, ctx.recipe.stages.qc.thresholds.max_truncated_frac
    lengths = ctx.lengths
    share = lengths.share_above(gen.max_tokens)
    if gen.enabled and share > limit:
        yield blocking("generate_truncation", "stages.generate.max_tokens",
                       f"about {_share(share)} of completions are expected to stop at max_tokens {gen.max_tokens} "
                       f"(mean output {lengths.mean:,.0f} tokens, {lengths.source}), "
                       f"over the QC limit of {_share(limit)}: the QC gate would fail after the generation is paid",
                       f"raise stages.generate.max_tokens (about {_tokens_for(lengths, limit):,} keeps it under "
                       f"{_share(limit)})")


def training_not_truncated(ctx: PlanContext) -> Iterable[Finding]:
    tok, limit = ctx.recipe.stages.tokenize, ctx.recipe.stages.qc.thresholds.max_truncated_frac
    stats = ctx.recipe.dataset.stats
    lengths = ctx.lengths
    room = min(tok.max_length - stats.prompt_tokens_mean, ctx.recipe.stages.generate.max_tokens)
    share = lengths.share_above(room)
    room_short = tok.max_length - stats.prompt_tokens_mean < ctx.recipe.stages.generate.max_tokens
    if tok.enabled and share > limit and room_short:
        cut = "cut to" if tok.overflow == "truncate" else "dropped at"
        yield blocking("train_truncation", "stages.tokenize.max_length",
                       f"about {_share(share)} of samples are {cut} tokenize.max_length {tok.max_length} (prompt "
                       f"{stats.prompt_tokens_mean:g} + output, {lengths.source}), over the QC limit of "
                       f"{_share(limit)}: their long reasoning never reaches the drafter",
                       f"raise stages.tokenize.max_length (about "
                       f"{int(stats.prompt_tokens_mean + _tokens_for(lengths, limit)):,} keeps it under "
                       f"{_share(limit)})")


def _tokens_for(lengths: Lengths, share: float) -> int:
    """Smallest round length whose expected share above is at most `share`."""
    tokens = 256
    while lengths.share_above(tokens) > share and tokens < 1 << 20:
        tokens += 256
    return tokens


def acknowledgements_known(ctx: PlanContext) -> Iterable[Finding]:
    for code in ctx.recipe.acknowledge:
        if code not in BLOCKING_CODES:
            close = did_you_mean(code, BLOCKING_CODES)
            hint = f" ({close})" if close else ""
            yield error("acknowledge_unknown", "acknowledge",
                        f"acknowledge lists {code!r}, which is no blocking finding{hint}",
                        f"use codes among {', '.join(BLOCKING_CODES)}, or remove it")


def dataset_sized(ctx: PlanContext) -> Iterable[Finding]:
    if ctx.tokens.samples == 0:
        yield warning("dataset_size_unknown", "dataset.stats.samples",
                      "the dataset size is unknown, so every estimate is zero",
                      "set dataset.stats.samples (or expected_count on each source)")


DATA_RULES: tuple[Rule, ...] = (thinking_on, generation_not_truncated, training_not_truncated,
                                acknowledgements_known, dataset_sized)
