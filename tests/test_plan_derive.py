"""Derived values: target layer spread, loss gamma, batch arithmetic, resolved recipe."""

from __future__ import annotations

from itertools import pairwise

import pytest
from _plan_recipes import seeds_recipe, tiny_recipe

from dflashx.plan.derive import loss_gamma, spread_layer_ids
from dflashx.plan.plan import make_plan


@pytest.mark.parametrize(("layers", "k", "ids"), [
    (64, 5, [1, 16, 31, 46, 61]),
    (36, 5, [1, 9, 17, 25, 33]),
    (6, 2, [1, 3]),  # tiny target: formula range 1..N-3 still holds k layers
    (6, 4, [0, 2, 3, 5]),  # 1..3 holds only 3: widen to every layer
    (4, 4, [0, 1, 2, 3]),
    (64, 1, [31]),
])
def test_spread_layer_ids(layers, k, ids):
    assert spread_layer_ids(layers, k) == ids


@pytest.mark.parametrize("layers", range(2, 70))
def test_spread_is_inside_and_increasing_whenever_possible(layers):
    for k in range(1, layers + 1):
        ids = spread_layer_ids(layers, k)
        assert len(ids) == k and all(0 <= i < layers for i in ids)
        assert all(b > a for a, b in pairwise(ids))


def test_loss_gamma_points_and_rule_between():
    assert (loss_gamma(16), loss_gamma(10), loss_gamma(8)) == (7.0, 5.0, 4.0)
    assert loss_gamma(9) == 4.5 and loss_gamma(13) == 6.0  # linear between the published points
    assert loss_gamma(2) == 1.0  # clamped
    values = [loss_gamma(b) for b in range(2, 33)]
    assert values == sorted(values)


def test_resolved_fills_every_derived_value():
    resolved = make_plan(seeds_recipe(drafter__mask_token_id=None)).to_json()["resolved"]
    assert resolved["drafter"]["target_layer_ids"] == [1, 16, 31, 46, 61]
    assert resolved["drafter"]["mask_token_id"] == 248_070  # from the target facts
    train = resolved["stages"]["train"]
    assert (train["micro_batch"], train["zero_stage"], train["grad_accum"]) == (1, 2, 16)  # 64 / (1 x 4)
    assert (train["loss_gamma"], train["max_length"]) == (7.0, 3072)
    assert resolved["target"]["facts"]["num_layers"] == 64
    assert resolved["hardware"]["gpu"]["memory_gb"] == 96 and resolved["hardware"]["num_gpus"] == 4


def test_recipe_values_win_over_defaults():
    r = seeds_recipe(drafter__target_layer_ids=[2, 10, 20, 30, 40], stages__train__micro_batch=2,
                     stages__train__zero_stage=1, stages__train__loss_gamma=3.0, stages__train__max_length=2048)
    resolved = make_plan(r).to_json()["resolved"]
    assert resolved["drafter"]["target_layer_ids"] == [2, 10, 20, 30, 40]
    train = resolved["stages"]["train"]
    assert (train["micro_batch"], train["zero_stage"], train["grad_accum"]) == (2, 1, 8)
    assert (train["loss_gamma"], train["max_length"]) == (3.0, 2048)


def test_tiny_recipe_resolves_on_the_builtin_target():
    plan = make_plan(tiny_recipe())
    resolved = plan.to_json()["resolved"]
    assert resolved["drafter"]["target_layer_ids"] == [1, 3]
    assert resolved["drafter"]["mask_token_id"] == 5
    assert resolved["stages"]["train"]["loss_gamma"] == 4.0
    assert plan.errors == []
