"""How the frozen online target is held during training, and the micro batch that goes with it (pure).

  target_sharding  `never` / `always` as the recipe says; `auto`: `zero3` when, with a whole copy
                   of the target on every GPU, the train-memory model (`dflashx.resolve.memory`) at
                   the run's longest sample exceeds one GPU and the node has GPUs to shard over
                   (the drafter stays data-parallel either way);
  micro_batch      the recipe's; else, with the target sharded, the largest divisor of
                   global_batch / world_size whose longest-sample memory fits one GPU: ZeRO-3
                   all-gathers every target layer once per micro step however many sequences it
                   carries, so more sequences per micro step spread that traffic
                   (`train.target_gather_seconds` in the plan) over more work, and the global
                   batch stays as the recipe states; else the profile's default (resolve.py).
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


def sharded_micro_batch(recipe: Recipe, facts: TargetFacts, drafter: DrafterDims, load_precision: str, world: int,
                        zero: int) -> int:
    """The largest divisor of global_batch / world_size that fits one GPU with the target sharded; 1
    when none does (the plan's `train_memory` rule then says so)."""
    gpu = recipe.hardware.gpu
    if gpu is None:
        return 1
    per_rank = recipe.stages.train.global_batch // world
    fits = (m for m in range(per_rank, 1, -1) if per_rank % m == 0 and longest_sample_bytes(
        recipe, facts, drafter, load_precision, "zero3", world, zero, m) <= gpu.memory_gb * 1e9)
    return next(fits, 1)
