"""Token counts: samples, prompt/output tokens and the share of tokens that carry loss.

Output tokens are what the `max_tokens` cap lets through, E[min(O, max_tokens)], and a training
sample's length what `max_length` keeps, P + E[min(O, max_tokens, max_length - P)], both from the
one output-length distribution (`lengths.OutputLengths.of`), not the capped mean. The rows the
trainer sees are the samples less `dataset.eval_holdout`, times the share tokenize keeps (`kept_share`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.config.schema import Recipe
from dflashx.plan.estimates.lengths import Lengths
from dflashx.plan.explain import Term, term
from dflashx.resolve.formulas import min_loss_tokens


@dataclass(frozen=True)
class Tokens:
    raw_prompts: int
    samples: int
    prompt_mean: float
    output_mean: float
    train_len_mean: float
    output_room: float  # output tokens a training sample keeps at most: min(max_length - prompt, max_tokens)
    train_rows: int  # rows of the tokenized dataset the trainer reads (holdout and tokenize's drops out)
    terms: tuple[Term, ...]

    @property
    def output(self) -> float:
        return self.samples * self.output_mean

    @property
    def prompt(self) -> float:
        return self.samples * self.prompt_mean

    @property
    def total(self) -> float:
        return self.output + self.prompt

    @property
    def train_tokens_per_epoch(self) -> float:
        return self.samples * self.train_len_mean


def raw_prompt_count(recipe: Recipe) -> int:
    """Sum over sources of min(expected_count, cap); a source without either counts 0."""
    total = 0
    for src in recipe.dataset.sources:
        counts = [c for c in (src.expected_count, src.cap) if c is not None]
        total += min(counts) if counts else 0
    return total


def kept_share(recipe: Recipe, lengths: Lengths, max_length: int) -> float:
    """Expected share of completions tokenize keeps: at least `min_loss_tokens` loss tokens within
    min(max_tokens, max_length - prompt), and under `overflow: drop` no more than max_length in all
    (dflashx.stages.tokenize `_apply_policy`; failed generations are not predicted)."""
    tok, prompt = recipe.stages.tokenize, recipe.dataset.stats.prompt_tokens_mean
    fewest = min_loss_tokens(tok.min_loss_tokens_blocks, recipe.drafter.block_size)
    cap, fits = recipe.stages.generate.max_tokens, max_length - prompt
    if min(cap, fits) < fewest:
        return 0.0
    share = lengths.share_above(fewest)
    if tok.overflow == "drop" and cap > fits:
        share -= lengths.share_above(fits)
    return max(share, 0.0)


def count_tokens(recipe: Recipe, max_length: int, lengths: Lengths) -> Tokens:
    stats, cap = recipe.dataset.stats, recipe.stages.generate.max_tokens
    counted = raw_prompt_count(recipe)
    samples = stats.samples if stats.samples is not None else counted
    raw = max(counted, samples)  # filtering only removes prompts
    output_mean = lengths.clipped_moment(1, cap)
    room = max(min(max_length - stats.prompt_tokens_mean, cap), 0.0)
    train_len = stats.prompt_tokens_mean + lengths.clipped_moment(1, room)
    out = samples * output_mean
    total = samples * (stats.prompt_tokens_mean + output_mean)
    kept = kept_share(recipe, lengths, max_length)
    rows = int(max(samples - recipe.dataset.eval_holdout, 0) * kept)
    terms = (
        term("tokens.raw_prompts", raw, "prompts",
             "max(sum over sources of min(expected_count, cap), samples)", counted=counted,
             sources=len(recipe.dataset.sources)),
        term("tokens.samples", samples, "samples", "dataset.stats.samples, else the counted raw prompts",
             stats_samples=stats.samples, counted=counted),
        term("tokens.output_mean", output_mean, "tokens/sample", "E[min(O, generate.max_tokens)] of the output-length "
             "distribution", max_tokens=cap, uncapped_mean=lengths.mean, distribution=lengths.source),
        term("tokens.output", out, "tokens", "samples x E[min(O, generate.max_tokens)]",
             samples=samples, output_tokens_mean=output_mean),
        term("tokens.total", total, "tokens", "samples x (prompt_tokens_mean + output tokens per sample)",
             samples=samples, prompt_tokens_mean=stats.prompt_tokens_mean, output_tokens_mean=output_mean),
        term("tokens.loss_fraction", out / total if total else 0.0, "fraction",
             "output tokens / all tokens (prompt tokens carry no loss)", output=out, total=total),
        term("tokens.train_length_mean", train_len, "tokens/sample",
             "prompt_tokens_mean + E[min(O, max_tokens, train max_length - prompt_tokens_mean)]",
             max_length=max_length),
        term("tokens.train_rows", rows, "rows", "(samples - dataset.eval_holdout) x share tokenize keeps (at least "
             "min_loss_tokens_blocks x block_size loss tokens; under overflow: drop, no longer than max_length)",
             samples=samples, eval_holdout=recipe.dataset.eval_holdout, kept_share=kept,
             overflow=recipe.stages.tokenize.overflow),
    )
    return Tokens(raw, samples, stats.prompt_tokens_mean, output_mean, train_len, room, rows, terms)
