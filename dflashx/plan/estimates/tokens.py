"""Token counts: samples, prompt/output tokens and the share of tokens that carry loss.

Output tokens are what the `max_tokens` cap lets through, E[min(O, max_tokens)], and a training
sample's length what `max_length` keeps, P + E[min(O, max_tokens, max_length - P)], both from the
one output-length distribution (`lengths.OutputLengths.of`), not the capped mean. The samples are
the prompts the ingest writes for generation (`dataset.eval_holdout` out), and the rows the trainer
reads. Tokenize's drops (fewer than `min_loss_tokens_blocks` x B loss tokens, `overflow: drop`) are not
predicted: a sample's loss tokens include the chat template's tokens around the completion, which the
completion-length distribution does not hold, so a prediction would drop short completions that
tokenize keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.config.schema import Recipe
from dflashx.plan.estimates.lengths import Lengths
from dflashx.plan.explain import Term, term


@dataclass(frozen=True)
class Tokens:
    raw_prompts: int
    samples: int
    prompt_mean: float
    output_mean: float
    train_len_mean: float
    output_room: float  # output tokens a training sample keeps at most: min(max_length - prompt, max_tokens)
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


def count_tokens(recipe: Recipe, max_length: int, lengths: Lengths) -> Tokens:
    stats, cap = recipe.dataset.stats, recipe.stages.generate.max_tokens
    counted = raw_prompt_count(recipe)
    holdout = recipe.dataset.eval_holdout
    samples = stats.samples if stats.samples is not None else max(counted - holdout, 0)
    raw = max(counted, samples + holdout)  # filtering only removes prompts; the holdout is ingested too
    output_mean = lengths.clipped_moment(1, cap)
    room = max(min(max_length - stats.prompt_tokens_mean, cap), 0.0)
    train_len = stats.prompt_tokens_mean + lengths.clipped_moment(1, room)
    out = samples * output_mean
    total = samples * (stats.prompt_tokens_mean + output_mean)
    terms = (
        term("tokens.raw_prompts", raw, "prompts",
             "max(sum over sources of min(expected_count, cap), samples + eval_holdout)", counted=counted,
             sources=len(recipe.dataset.sources)),
        term("tokens.samples", samples, "samples", "dataset.stats.samples, else the counted raw prompts less "
             "dataset.eval_holdout (the ingest keeps those out of generation)",
             stats_samples=stats.samples, counted=counted, eval_holdout=holdout),
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
    )
    return Tokens(raw, samples, stats.prompt_tokens_mean, output_mean, train_len, room, terms)
