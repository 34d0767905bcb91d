"""How the frozen online target is held during training, and the micro batch that goes with it (pure).

  target_sharding  `never` / `always` as the recipe says; `auto`: `zero3` when, with a whole copy
                   of the target on every GPU, the train-memory model (`dflashx.resolve.memory`) at
                   the run's longest sample exceeds one GPU and the node has GPUs to shard over
                   (the drafter stays data-parallel either way);
  micro_batch      the recipe's; else on GPUs a divisor of global_batch / world_size: with the target
                   sharded, the largest whose longest-sample memory fits one GPU (ZeRO-3 all-gathers
                   every target layer once per micro step however many sequences it carries,
                   `train.target_gather_seconds`, so more sequences spread that traffic); otherwise
                   the smallest whose drafter tokens per micro step (micro x anchors_per_seq x
                   block_size) reach the 8,192 of the shape the GPU MFU was measured at
                   (`MFU_TOKENS`), within that memory: a micro step with fewer is launch-bound on a
                   GPU (the tiny run: 512 tokens per sequence, ~6 optimizer steps/s of 8 micro steps
                   on an H100), and the global batch stays as the recipe states; 1 when none fits;
                   on the CPU the CPU default (resolve.py).
"""

from __future__ import annotations

from dflashx.config.schema import Recipe
from dflashx.resolve.flops import DrafterDims
from dflashx.resolve.formulas import train_precision
from dflashx.resolve.memory import longest_sample, sequence_activations, train_memory_parts
from dflashx.targets.registry import TargetFacts


def longest_sample_bytes(recipe: Recipe, facts: TargetFacts, drafter: DrafterDims, load_precision: str,
                         sharding: str, world: int, zero: int, micro: int) -> float:
    """Per-GPU training memory with every sample at the run's longest (`memory.longest_sample` tokens,
    all anchors_per_seq blocks): what a micro step may reach."""
    train, tokenize_max = recipe.stages.train, recipe.stages.tokenize.max_length
    length = longest_sample(train.max_length or tokenize_max, tokenize_max)
    sample = sequence_activations(facts, drafter, load_precision, length, train.anchors_per_seq,
                                  recipe.drafter.block_size)
    parts = train_memory_parts(
        facts, drafter, online=train.mode == "online", load_precision=load_precision,
        train_precision=train_precision(recipe.hardware.gpu is not None, recipe.target.precision),
        master_weights=train.master_weights, optimizer=train.optimizer, sharding=sharding, ranks=world,
        zero_stage=zero, micro_batch=micro, sample=sample)
    return sum(parts.values())


def target_sharding(recipe: Recipe, facts: TargetFacts, drafter: DrafterDims, load_precision: str, world: int,
                    zero: int, micro: int) -> str:
    """`zero3` when the recipe forces it, or (`auto`) when a whole target per GPU does not fit (module doc)."""
    choice, gpu = recipe.stages.train.shard_target, recipe.hardware.gpu
    if choice != "auto":
        return "zero3" if choice == "always" else "none"
    if gpu is None or recipe.stages.train.mode != "online" or world < 2:
        return "none"
    whole = longest_sample_bytes(recipe, facts, drafter, load_precision, "none", world, zero, micro)
    return "zero3" if whole > gpu.memory_gb * 1e9 else "none"


# Drafter tokens per micro step in the shape the GPU training MFU was measured at (benchmarks/train_step.py:
# 512 anchors x block 16, one sequence per micro step; `plan.estimates.mfu`).
MFU_TOKENS = 512 * 16


def gpu_micro_batch(recipe: Recipe, facts: TargetFacts, drafter: DrafterDims, load_precision: str, world: int,
                    zero: int, sharding: str) -> int:
    """A divisor of global_batch / world_size (module doc): the largest that fits one GPU with the target sharded,
    else the smallest reaching MFU_TOKENS drafter tokens among those that fit; 1 when none does (the plan's
    `train_memory` rule then says so)."""
    gpu, train = recipe.hardware.gpu, recipe.stages.train
    if gpu is None:
        return 1
    per_rank = max(train.global_batch // world, 1)
    fitting = [m for m in range(1, per_rank + 1) if per_rank % m == 0 and (m == 1 or longest_sample_bytes(
        recipe, facts, drafter, load_precision, sharding, world, zero, m) <= gpu.memory_gb * 1e9)]
    if sharding == "zero3":
        return fitting[-1]
    tokens = train.anchors_per_seq * recipe.drafter.block_size
    return next((m for m in fitting if m * tokens >= MFU_TOKENS), fitting[-1])
