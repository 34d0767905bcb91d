"""The sharded target's all-gather traffic per micro step, over the profile's interconnect.

With `stages.train.target_sharding: zero3` each of the N ranks holds 1/N of the frozen target, and
every forward of a micro batch all-gathers the weights of each module it runs through before
running it (ZeRO-3's parameter all-gather, Rajbhandari et al. 2020, sec. 7.2.2: one all-gather of
the parameters in the forward pass). The target is frozen and its captured states are detached,
so there is no backward gather and no gradient reduce-scatter for it. A ring all-gather delivers
(N-1)/N of the gathered bytes to every rank. The forward embeds the tokens and runs to the
deepest tapped layer (with `labels: target`, through every layer and its LM head); an MoE layer's
experts are gathered whole whatever the routing (transformers holds them in one fused tensor).
  bytes per micro step = (N-1)/N x (embedding + layers 0..deepest [+ the rest and the LM head])
                         x load precision bytes
  seconds per micro step = bytes / bandwidth (the slowest link the ring crosses, as the gradient sync)
Overlap with the forward's compute (ZeRO-3 prefetch) is not counted: an upper bound, as for the
gradient sync. Micro steps per rank: optimizer steps x grad_accum. More sequences per micro step
spread the same bytes over more work, which is why resolve raises the micro batch with the target
sharded (`dflashx.resolve.sharding`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.config.fields import PRECISION_BYTES
from dflashx.plan.estimates.gradsync import bandwidth_bps
from dflashx.plan.explain import Term, explained
from dflashx.plan.expr import Expr, const, named, var
from dflashx.resolve.model import ResolvedRecipe


@dataclass(frozen=True)
class TargetGather:
    bytes_per_micro_step: float  # per rank
    seconds_per_micro_step: float
    term: Term


def gathered_params(recipe: ResolvedRecipe) -> int:
    """Target parameters one forward runs through (module doc)."""
    facts, train = recipe.target.facts, recipe.stages.train
    if train.labels == "target":
        return facts.params_through_layer(facts.num_layers - 1) + facts.embedding_params
    return facts.params_through_layer(max(recipe.drafter.target_layer_ids)) + facts.vocab_size * facts.hidden_size


def target_gather(recipe: ResolvedRecipe) -> TargetGather:
    train = recipe.stages.train
    n = train.world_size
    sharded = train.target_sharding == "zero3" and train.mode == "online" and n > 1
    ranks = var("ranks", n)
    volume = named("bytes_per_gpu", (ranks - 1) / ranks * var("gathered_params", gathered_params(recipe))
                   * var("load_bytes", PRECISION_BYTES[recipe.target.load_precision]))
    bw = bandwidth_bps(recipe)
    seconds: Expr
    if not sharded:
        volume, seconds = named("bytes_per_gpu", const(0.0)), const(0.0)
        note = "the target is not sharded: nothing to gather"
    elif bw is None:
        seconds, note = const(0.0), "not counted: the profile states no interconnect_gbs/internode_gbs"
    else:
        seconds, note = volume / var("bandwidth_bps", bw), "no overlap with the forward assumed (an upper bound)"
    return TargetGather(volume.value, seconds.value, explained(
        "train.target_gather_seconds", seconds, "s/micro step",
        "ZeRO-3 parameter all-gather in the forward (Rajbhandari et al. 2020, sec. 7.2.2)",
        bytes_per_gpu=volume.value, ranks=n, target_sharding=train.target_sharding, micro_batch=train.micro_batch,
        gathered_params=gathered_params(recipe), load_precision=recipe.target.load_precision, bandwidth_bps=bw,
        note=note))
