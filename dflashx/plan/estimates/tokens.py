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
from dflashx.plan.explain import Term, explained
from dflashx.plan.expr import call, const, maximum, minimum, named, var


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
    stats, cap = recipe.dataset.stats, var("max_tokens", recipe.stages.generate.max_tokens)
    counted, holdout = var("counted", raw_prompt_count(recipe)), var("eval_holdout", recipe.dataset.eval_holdout)
    samples = named("samples", var("stats_samples", stats.samples) if stats.samples is not None
                    else maximum(counted - holdout, 0))
    raw = maximum(counted, samples + holdout)  # filtering only removes prompts; the holdout is ingested too
    mean_capped = lambda c: lengths.clipped_moment(1, c)  # noqa: E731  # E[min(O, c)] of the output lengths
    output_mean = named("output_tokens_mean", call(mean_capped, cap, name="E_min_O"))
    prompt = var("prompt_tokens_mean", stats.prompt_tokens_mean)
    room = named("room", maximum(minimum(var("max_length", max_length) - prompt, cap), 0.0))
    train_len = prompt + call(mean_capped, room, name="E_min_O")
    out, total = named("output", samples * output_mean), named("total", samples * (prompt + output_mean))
    terms = (
        explained("tokens.raw_prompts", raw, "prompts", sources=len(recipe.dataset.sources)),
        explained("tokens.samples", samples, "samples", "counted: sum over sources of min(expected_count, cap); "
                  "the ingest keeps dataset.eval_holdout of them out of generation", stats_samples=stats.samples,
                  counted=counted.value, eval_holdout=holdout.value),
        explained("tokens.output_mean", output_mean, "tokens/sample", "E_min_O(c) = E[min(O, c)] of the "
                  "output-length distribution", uncapped_mean=lengths.mean, distribution=lengths.source),
        explained("tokens.output", out, "tokens"),
        explained("tokens.total", total, "tokens"),
        explained("tokens.loss_fraction", out / total if total.value else const(0.0), "fraction",
                  "prompt tokens carry no loss"),
        explained("tokens.train_length_mean", train_len, "tokens/sample"),
    )
    return Tokens(int(raw.value), int(samples.value), stats.prompt_tokens_mean, output_mean.value, train_len.value,
                  room.value, terms)
