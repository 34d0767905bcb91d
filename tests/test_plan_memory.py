"""The plan's activation memory at the longest sample the run can see, not the mean one."""

from __future__ import annotations

import pytest
from _plan_recipes import seeds_recipe

from dflashx.plan.context import build_context
from dflashx.plan.estimates.memory import longest_sample_activations
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
    few = longest_sample_activations(resolved(stages__train__anchors_per_seq=8192))
    many = longest_sample_activations(resolved(stages__train__anchors_per_seq=8192,
                                               stages__tokenize__max_length=6144))
    assert many.drafter_tokens == 2 * few.drafter_tokens and many.total == pytest.approx(2 * few.total)


def test_the_longest_sample_is_what_tokenize_and_the_trainer_both_let_through():
    assert longest_sample_activations(resolved()).length == 3072
    assert longest_sample_activations(resolved(stages__train__max_length=2048)).length == 2048
    # tokenize cut them at 3,072
    assert longest_sample_activations(resolved(stages__train__max_length=8192)).length == 3072


def test_micro_batch_multiplies_the_longest_sequence():
    one, four = activations(), activations(stages__train__micro_batch=4)
    assert four == pytest.approx(4 * one)


def eval_parts(**overrides) -> dict[str, float]:
    return build_context(resolved(**overrides)).memory["eval"].parts


def test_eval_memory_holds_the_longest_prompt_plus_max_new_tokens():
    """Was a fixed 4,096-token prompt: now the longest training sample plus the tokens evaluation generates."""
    kv = QWEN36.kv_bytes_per_token(2)  # bf16 on the GPU profile
    base = eval_parts()["one_sequence"]
    assert base == pytest.approx(kv * (3072 + 256) + QWEN36.recurrent_state_bytes)
    assert eval_parts(stages__eval__max_new_tokens=1256)["one_sequence"] - base == pytest.approx(kv * 1000)
    assert eval_parts(stages__tokenize__max_length=8192)["one_sequence"] - base == pytest.approx(kv * 5120)


def test_eval_memory_counts_what_evaluation_loads():
    """On a CPU profile a bf16 target is loaded in fp32 (target.load_precision): twice the bytes."""
    cpu = build_context(resolve(seeds_recipe("cpu"), QWEN36))
    gpu = build_context(resolved())
    assert cpu.recipe.target.load_precision == "fp32"
    assert cpu.memory["eval"].parts["target_weights"] == 2 * gpu.memory["eval"].parts["target_weights"]
