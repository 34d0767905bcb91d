"""Derived recipe values the planner fills in (`Plan.resolved`): pure arithmetic on the recipe."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dflashx.config.schema import HardwareProfile, Recipe
from dflashx.targets.registry import TargetFacts

BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
KV_BYTES = {"bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}


def activation_bytes(dtype: str) -> int:
    """Bytes of one activation element: fp32 stays fp32, everything else computes in 16 bits."""
    return 4 if dtype == "fp32" else 2

# DFlash's loss decay gamma by block size (arXiv 2602.06036): 7 for B=16, 5 for B=10, 4 for B=8.
_GAMMA_POINTS = ((8, 4.0), (10, 5.0), (16, 7.0))


def _round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def spread_layer_ids(num_layers: int, k: int) -> list[int]:
    """k target layer ids spread evenly: round(1 + i*(N-4)/(k-1)), i = 0..k-1.

    [1, 16, 31, 46, 61] for N=64, k=5; [1, 9, 17, 25, 33] for N=36. Small targets where the
    range 1..N-3 holds fewer than k layers widen it to 0..N-1; k > N gives ids the layer-id rule
    rejects (it cannot be satisfied). k = 1 takes the middle of the range.
    """
    lo, hi = 1, num_layers - 3
    if hi - lo + 1 < k:
        lo, hi = 0, num_layers - 1
    if k == 1:
        return [_round_half_up((lo + hi) / 2)]
    return [_round_half_up(lo + i * (hi - lo) / (k - 1)) for i in range(k)]


def loss_gamma(block_size: int) -> float:
    """Piecewise-linear through (8, 4), (10, 5), (16, 7), extended with the end slopes; at least 1."""
    (b0, g0), (b1, g1), (b2, g2) = _GAMMA_POINTS
    if block_size <= b1:
        value = g0 + (block_size - b0) * (g1 - g0) / (b1 - b0)
    else:
        value = g1 + (block_size - b1) * (g2 - g1) / (b2 - b1)
    return round(max(value, 1.0), 4)


def world_size(profile: HardwareProfile) -> int:
    """Training processes: one per GPU, one on the CPU profile."""
    return max(profile.num_gpus, 1)


@dataclass(frozen=True)
class Derived:
    """Values a recipe may leave out, filled from the target facts and the hardware profile."""

    target_layer_ids: list[int]
    mask_token_id: int | None
    micro_batch: int
    zero_stage: int
    grad_accum: int
    loss_gamma: float
    max_length: int
    world_size: int


def derive(recipe: Recipe, facts: TargetFacts) -> Derived:
    drafter, train, hw = recipe.drafter, recipe.stages.train, recipe.hardware
    micro = train.micro_batch or hw.training.micro_batch
    ws = world_size(hw)
    return Derived(
        target_layer_ids=list(
            drafter.target_layer_ids or spread_layer_ids(facts.num_layers, drafter.num_target_layers)),
        mask_token_id=drafter.mask_token_id if drafter.mask_token_id is not None else facts.mask_token_id,
        micro_batch=micro,
        zero_stage=train.zero_stage if train.zero_stage is not None else hw.training.zero_stage,
        grad_accum=max(1, math.ceil(train.global_batch / (micro * ws))),
        loss_gamma=train.loss_gamma or loss_gamma(drafter.block_size),
        max_length=train.max_length or recipe.stages.tokenize.max_length,
        world_size=ws,
    )
