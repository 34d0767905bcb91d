"""The plan's activation memory at the longest sample the run can see, not the mean one."""

from __future__ import annotations

import pytest
from _plan_recipes import seeds_recipe

from dflashx.plan.context import build_context
from dflashx.plan.estimates.activations import longest_sample, peak_sequence_activations
from dflashx.resolve import resolve
from dflashx.targets.registry import lookup

QWEN36 = lookup("Qwen/Qwen3.6-27B")


def resolved(**overrides):
    return resolve(seeds_recipe("h200_x1", **overrides), QWEN36)


def activations(**overrides) -> float:
    return build_context(resolved(**overrides)).memory["train"].parts["activations"]


def test_activations_follow_max_length_not_the_mean_length():
    base = activations()
    # the mean output length moved the old estimate; the longest sample does not move with it
    assert activations(dataset__stats__output_tokens_mean=300) == base
    # twice the longest sample: the captured target states double (the blocks are capped by anchors_per_seq)
    longer = activations(stages__tokenize__max_length=6144)
    h, k = QWEN36.hidden_size, 5
    assert longer - base == pytest.approx(k * 3072 * h * 2)
    # with more anchors than tokens every term grows with the length
    few = peak_sequence_activations(resolved(stages__train__anchors_per_seq=8192))
    many = peak_sequence_activations(resolved(stages__train__anchors_per_seq=8192, stages__tokenize__max_length=6144))
    assert many.drafter_tokens == 2 * few.drafter_tokens and many.total == pytest.approx(2 * few.total)


def test_the_longest_sample_is_what_tokenize_and_the_trainer_both_let_through():
    assert longest_sample(resolved()) == 3072
    assert longest_sample(resolved(stages__train__max_length=2048)) == 2048
    assert longest_sample(resolved(stages__train__max_length=8192)) == 3072  # tokenize cut them at 3,072


def test_micro_batch_multiplies_the_longest_sequence():
    one, four = activations(), activations(stages__train__micro_batch=4)
    assert four == pytest.approx(4 * one)
