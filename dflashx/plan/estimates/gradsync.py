"""The drafter's gradient synchronisation per optimizer step, over the profile's interconnect.

Only the drafter trains (the target is frozen), so only its P parameters' gradients travel. A ring
all-reduce moves 2 (n-1)/n x the gradient bytes through each of n GPUs (reduce-scatter, then
all-gather); what the ZeRO stage changes is how often:
  ZeRO 0 and 1: gradients accumulate locally over the micro steps and are reduced once at the
                optimizer step (ZeRO-1 reduce-scatters them and all-gathers the updated weights:
                the same 2 (n-1)/n P, Rajbhandari et al. 2020, sec. 7);
  ZeRO 2:       each rank keeps only its gradient partition, so every micro step reduce-scatters
                (n-1)/n P ("ZeRO stage 2 communicates during non gradient accumulation boundaries as
                well", DeepSpeed PR #338), and the updated weights are all-gathered once per step.
Gradients travel in the drafter's precision (DeepSpeed's default communication dtype). Bandwidth
is the profile's `interconnect_gbs` per GPU and direction; with several nodes the ring also crosses
`internode_gbs`, the slower one binds. Overlap with the backward pass (DeepSpeed's `overlap_comm`,
on for several ranks) is not counted: the time is added to the step, an upper bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.plan.explain import Term, explained
from dflashx.plan.expr import Expr, const, named, var
from dflashx.resolve.model import ResolvedRecipe


@dataclass(frozen=True)
class GradSync:
    bytes_per_gpu: float  # per optimizer step
    seconds: float  # per optimizer step
    term: Term


def bandwidth_bps(recipe: ResolvedRecipe) -> float | None:
    """Bytes/s per GPU and direction of the slowest link a ring over all ranks crosses; None unknown."""
    hw = recipe.hardware
    links = [hw.interconnect_gbs] if hw.gpus_per_node > 1 else []
    links += [hw.internode_gbs] if hw.nodes > 1 else []
    known = [link for link in links if link is not None]
    return min(known) * 1e9 if links and len(known) == len(links) else None


def _volume(recipe: ResolvedRecipe, params: int) -> Expr:
    """Bytes each rank sends per optimizer step: ZeRO-2 reduce-scatters every micro step's gradients and
    all-gathers the updated shards once; else one all-reduce (2 (n-1)/n of the gradients) per step."""
    train = recipe.stages.train
    ranks = var("ranks", train.world_size)
    share = (ranks - 1) / ranks
    grads = var("drafter_params", params) * var("bytes_per_grad", 2 if train.precision == "bf16" else 4)
    if train.zero_stage == 2:
        return named("bytes_per_gpu", (var("grad_accum", train.grad_accum) + 1) * share * grads)
    return named("bytes_per_gpu", 2 * share * grads)


def grad_sync(recipe: ResolvedRecipe, params: int) -> GradSync:
    train = recipe.stages.train
    bw = bandwidth_bps(recipe)
    volume = _volume(recipe, params)
    seconds: Expr
    if train.world_size == 1 or recipe.hardware.gpu is None:
        volume, seconds = named("bytes_per_gpu", const(0.0)), const(0.0)
        note = "one process, or the CPU profile: nothing to synchronise"
    elif bw is None:
        seconds, note = const(0.0), "not counted: the profile states no interconnect_gbs/internode_gbs"
    else:
        seconds, note = volume / var("bandwidth_bps", bw), "no overlap with the backward pass assumed (an upper bound)"
    return GradSync(volume.value, seconds.value, explained(
        "train.grad_sync_seconds", seconds, "s/step",
        "ring all-reduce volume (Rajbhandari et al. 2020, sec. 7); ZeRO-2 per micro step: DeepSpeed PR #338",
        bytes_per_gpu=volume.value, ranks=train.world_size, zero_stage=train.zero_stage, grad_accum=train.grad_accum,
        bandwidth_bps=bw, note=note))
