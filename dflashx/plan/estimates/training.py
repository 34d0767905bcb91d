"""Training time: the one FLOP model (`dflashx.resolve.flops`) over the length distribution, at a
measured MFU, plus the drafter's gradient synchronisation.

Per sample of training length L (prompt + what max_tokens and max_length keep of the output),
n = min(anchors_per_seq, loss tokens) anchors and B the block size: the target forward to the
deepest tapped layer over L tokens, and one drafter pass over D = n x B block tokens with L
context tokens, n x (B - 1) supervised slots and the block attention pairs of anchors spread
evenly over the completion. The trainer logs its MFU with the same functions on the real lengths;
the planner averages them over `QUADRATURE` equal-probability lengths of the output distribution
(so the attention terms see E[L^2], not the square of the mean).
Time = FLOPs x sequences / (peak x GPUs x MFU) + optimizer steps x gradient sync (`gradsync.py`)
+ micro steps x the sharded target's all-gather (`gather.py`; zero without sharding). An MoE target's
routed experts leave the MFU term and are timed by `moe.trainer_moe` (transformers' grouped_mm path at
the micro step's tokens), unless a calibrated MFU (which measured them) replaces the model.
+ the held-out τ measurements (`tau_probe`: `dflashx.resolve.tau.measurements` of them, each a batch-1
greedy decode of the held-out slice on rank 0, bounded as the eval stage's estimate bounds a decode:
at τ 1, each token a draft-verify cycle whose target forward verifies block_size tokens). Unset,
`stages.train.tau_every` is derived here from the rest of the time (`dflashx.resolve.tau.tau_every`) and
handed on in `Training.tau_every`.
MFU: `hardware.calibrated.training_mfu` (measured on this node, all-reduce and gathers included:
they are then not added again), else the cited table row (`mfu.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.plan.estimates.decode import dense_read_bytes
from dflashx.plan.estimates.speculative import drafter_window
from dflashx.plan.estimates.device import CALIBRATED_MFU, CALIBRATED_TAU_PROBE, device_of, factor
from dflashx.plan.estimates.gather import TargetGather, target_gather
from dflashx.plan.estimates.gradsync import GradSync, grad_sync
from dflashx.plan.estimates.host import batch1_seconds_per_token, in_process_tokens_per_s
from dflashx.plan.estimates.lengths import Lengths
from dflashx.plan.estimates.mfu import MfuRow, mfu_row
from dflashx.plan.estimates.speculative import dflash_drafter
from dflashx.plan.estimates.moe import TrainerMoe, touched_bytes, trainer_moe
from dflashx.plan.estimates.tokens import Tokens
from dflashx.plan.explain import Term, explained, term
from dflashx.plan.expr import Expr, call, const, named, total, var
from dflashx.resolve.flops import DrafterDims, block_pairs, drafter_step_flops, target_pass_flops
from dflashx.resolve.formulas import effective_batch, optimizer_steps, steps_per_epoch
from dflashx.resolve.model import ResolvedRecipe
from dflashx.resolve.tau import TAU_SHARE, measurable, measurements, tau_every


@dataclass(frozen=True)
class Training:
    drafter: DrafterDims
    steps: int
    sequences: int  # sequences trained: steps x the effective batch
    drafter_tokens_per_sample: float
    flops: float
    seconds: float
    tau_every: int  # the resolved stages.train.tau_every (derived here when the recipe leaves it unset)
    terms: tuple[Term, ...]


QUADRATURE = 32  # equal-probability output lengths the per-sample FLOPs are averaged over


def sample_lengths(lengths: Lengths, room: float) -> list[float]:
    """Output tokens a training sample keeps, at the midpoints of QUADRATURE equal-probability slices."""
    return [min(lengths.quantile((i + 0.5) / QUADRATURE), room) for i in range(QUADRATURE)]


def flops_per_sample(recipe: ResolvedRecipe, prompt: float, outputs: list[float]) -> tuple[float, float, float]:
    """(target FLOPs, drafter + LM head FLOPs, anchors) per sample, averaged over samples of these output
    lengths (anchors: min(anchors_per_seq, the sample's loss tokens); its block tokens are anchors x block_size)."""
    train, facts, block = recipe.stages.train, recipe.target.facts, recipe.drafter.block_size
    target = target_pass_flops(facts, recipe.drafter.target_layer_ids, train.labels, [prompt + o for o in outputs],
                               sum(outputs))
    drafter = anchored = 0.0
    for output in outputs:
        anchors = min(train.anchors_per_seq, output)
        pairs = block_pairs(anchors * (prompt + output / 2), anchors, block)
        drafter += drafter_step_flops(recipe.drafter.dims, anchors * block, prompt + output, pairs,
                                      anchors * (block - 1))
        anchored += anchors
    n = len(outputs)
    return target / n, drafter / n, anchored / n


def tau_probe(recipe: ResolvedRecipe, lengths: Lengths) -> Term:
    """One held-out τ measurement: `tau_prompts` greedy decodes on rank 0, each to the end of its turn (the
    output-length mean capped at `tau_max_new_tokens`), at the τ-1 rate (the untrained drafter's: an upper
    bound); on a GPU the batch-1 bandwidth bound of the eval estimate over one draft-verify cycle per token
    (the target's dense weights, an MoE target's experts touched by the block_size tokens it verifies, the
    drafter's weights), on the CPU the in-process decoder."""
    train, block = recipe.stages.train, recipe.drafter.block_size
    output = lengths.clipped_moment(1, train.tau_max_new_tokens)
    measured, calibrated = factor(recipe.hardware, CALIBRATED_TAU_PROBE, 0.0)
    if calibrated:
        return term("train.tau_probe_seconds", measured, "s", "measured on this node by the pilot's training: the "
                    "median seconds of one held-out τ measurement (hardware.calibrated.tau_probe_seconds; a "
                    "batched decode of small models is launch-bound on a GPU, which no roofline prices)",
                    tau_prompts=train.tau_prompts, output_tokens=output, calibrated=True)
    per_token: Expr
    if recipe.hardware.gpu is None:
        per_token = named("seconds_per_token", 1 / var("in_process_tokens_per_s",
                                                        in_process_tokens_per_s(recipe, [0.0] * (block - 1))))
    else:
        facts, dtype = recipe.target.facts, recipe.target.load_precision
        weights = total(var("dense_bytes", dense_read_bytes(facts, dtype)),
                        var("routed_bytes", facts.num_moe_layers * touched_bytes(facts, block, dtype)),
                        var("drafter_bytes", dflash_drafter(recipe, recipe.drafter.dims, block, drafter_window(recipe),
                                                            1.0).weight_bytes))
        per_token = batch1_seconds_per_token(recipe, weights, 1)
    seconds = var("tau_prompts", train.tau_prompts) * var("output_tokens", output) * per_token
    return explained("train.tau_probe_seconds", seconds, "s",
                     "tau_prompts greedy decodes of the output-length mean capped at tau_max_new_tokens, at batch 1 "
                     "and τ 1 (an upper bound): on a GPU the weights a draft-verify cycle reads (the target's dense "
                     "weights, the experts block_size verified tokens touch, the drafter's) at the bandwidth bound "
                     "of the eval estimate; on the CPU the in-process decoder", block_size=block)


def _params_term(drafter: DrafterDims) -> Term:
    """Every parameter of the built drafter (`DrafterDims.trainable`): the matrices a slot's gradient reaches
    whole, and what a Muon run leaves to the auxiliary AdamW (norms, base kernels, codebooks)."""
    trainable = var("matrices", drafter.matrices) + var("adamw_params", drafter.adamw_params)
    return explained("train.drafter_params", trainable, "params", layer_params=drafter.layer_params,
                     fc_params=drafter.fc_params, norm_params=drafter.norm_params, num_layers=drafter.num_layers,
                     **drafter.modules.param_inputs)


def _flops_term(recipe: ResolvedRecipe, target_f: float, drafter_f: float, tokens: Tokens) -> Term:
    """FLOPs per training sample, each part by `dflashx.resolve.flops` and averaged over QUADRATURE lengths."""
    drafter, train = recipe.drafter.dims, recipe.stages.train
    per_sample = var("target", target_f) + var("drafter_and_head", drafter_f)
    return explained(
        "train.flops_per_sample", per_sample, "FLOP",
        f"dflashx.resolve.flops, the mean over {QUADRATURE} quantiles of the training length L: target = the "
        "forward to the deepest tapped layer (labels: target — its last layer and LM head); drafter_and_head = "
        "the drafter's forward/backward over the block tokens with L context tokens and the frozen LM head on "
        "the supervised slots; Kaplan et al. 2020 (2N forward / 6N training FLOPs per token), plus attention",
        L_mean=tokens.train_len_mean, **drafter.modules.flop_inputs,
        last_target_layer=max(recipe.drafter.target_layer_ids), labels=train.labels)


def _steps(recipe: ResolvedRecipe, tokens: Tokens) -> tuple[Expr, Expr]:
    """(optimizer steps, effective batch): a step per effective batch of the samples each rank's sampler keeps,
    max_steps else ceil(epochs x steps per epoch) (`dflashx.resolve.formulas`, as the trainer counts)."""
    train = recipe.stages.train
    micro, accum, world = var("micro_batch", train.micro_batch), var("grad_accum", train.grad_accum), \
        var("world_size", train.world_size)
    per_epoch = named("steps_per_epoch", call(steps_per_epoch, var("samples", tokens.samples), micro, accum, world))
    steps = call(optimizer_steps, per_epoch, var("epochs", train.epochs), var("max_steps", train.max_steps))
    return steps, named("effective_batch", call(effective_batch, micro, accum, world))


def _compute(recipe: ResolvedRecipe, per_sample: float, sequences: Expr, calibrated: bool, moe: TrainerMoe,
             mfu: float) -> Expr:
    """The FLOPs at the MFU: a calibrated MFU measured the routed experts too; else they leave the dense FLOPs and
    are timed by `moe.trainer_moe`."""
    peak = var("peak_flops", recipe.stages.train.peak_flops) * var("gpus", device_of(recipe.hardware).count) \
        * var("mfu", mfu)
    flops = var("flops_per_sample", per_sample)
    if calibrated:
        return named("compute_s", flops * sequences / peak)
    routed = var("moe_routed_flops_per_sample", moe.routed_flops)
    moe_s = named("moe_s", var("moe_seconds_per_sequence", moe.seconds) * sequences
                  / var("gpus", device_of(recipe.hardware).count))
    return named("compute_s", (flops - routed) * sequences / peak + moe_s)


def _overheads(recipe: ResolvedRecipe, steps: Expr, calibrated: bool, sync: GradSync,
               gather: TargetGather) -> list[Expr]:
    """Per optimizer step the gradient sync, per micro step the sharded target's gather; 0 when the MFU was
    calibrated (its measurement holds them)."""
    if calibrated:
        return [named("grad_sync_s", const(0.0)), named("target_gather_s", const(0.0))]
    accum = var("grad_accum", recipe.stages.train.grad_accum)
    return [named("grad_sync_s", var("grad_sync_seconds_per_step", sync.seconds) * steps),
            named("target_gather_s", var("gather_seconds_per_micro_step", gather.seconds_per_micro_step) * steps
                  * accum)]


def _mfu_source(row: MfuRow, calibrated: bool) -> str:
    if calibrated:
        return "measured on this node: hardware.calibrated.training_mfu (includes the gradient sync)"
    return f"{row.generation}/{row.precision}/{row.kind}: {row.source}" + (
        f" — borrowed: {row.borrowed}" if row.borrowed else "")


def estimate_training(recipe: ResolvedRecipe, tokens: Tokens, lengths: Lengths) -> Training:
    train, hw, facts = recipe.stages.train, recipe.hardware, recipe.target.facts
    drafter = recipe.drafter.dims
    outputs = sample_lengths(lengths, tokens.output_room)
    target_f, drafter_f, anchors = flops_per_sample(recipe, tokens.prompt_mean, outputs)
    block_tokens = var("mean_anchors", anchors) * var("block_size", recipe.drafter.block_size)
    steps_expr, batch = _steps(recipe, tokens)
    steps = var("steps", steps_expr.value)  # train.steps explains it
    sequences = named("sequences", steps * batch)
    row = mfu_row(hw, recipe.target.load_precision, facts.num_linear_layers > 0)
    mfu, calibrated = factor(hw, CALIBRATED_MFU, row.mfu)
    sync, gather = grad_sync(recipe, drafter.trainable), target_gather(recipe)
    deepest = facts.num_layers - 1 if train.labels == "target" else max(recipe.drafter.target_layer_ids)
    moe = trainer_moe(facts, deepest, [tokens.prompt_mean + o for o in outputs], train.micro_batch,
                      "fp8" if recipe.target.load_precision == "fp8" else "bf16", device_of(hw))
    rest = named("rest_s", total(_compute(recipe, target_f + drafter_f, sequences, calibrated, moe, mfu),
                                 *_overheads(recipe, steps, calibrated, sync, gather)))
    probe = tau_probe(recipe, lengths)
    every = named("tau_every", call(tau_every, var("given", train.tau_every), var("measurable", measurable(train)),
                                    steps, var("rest_s", rest.value), var("tau_probe_seconds", probe.value)))
    tau_s = named("tau_s", call(measurements, steps, every) * var("tau_probe_seconds", probe.value))
    seconds = rest + tau_s
    terms = (
        _params_term(drafter),
        explained("train.drafter_tokens_per_sample", block_tokens, "tokens", "mean_anchors: E[min(anchors_per_seq, "
                  f"loss tokens)] over {QUADRATURE} quantiles of the length distribution",
                  anchors_per_seq=train.anchors_per_seq),
        _flops_term(recipe, target_f, drafter_f, tokens),
        explained("train.steps", steps_expr, "optimizer steps", effective_batch=batch.value,
                  global_batch=train.global_batch),
        sync.term,
        gather.term,
        probe,
        explained("train.tau_seconds", tau_s, "s", tau_share=TAU_SHARE,
                  share_of_rest=tau_s.value / rest.value if rest.value else 0.0,
                  measurements=measurements(int(steps.value), int(every.value))),
        explained("train.seconds", seconds, "s", mfu_source=_mfu_source(row, calibrated),
                  moe_layer=moe.layer.inputs() if moe.layer else None, calibrated=calibrated),
    )
    return Training(drafter, int(steps.value), int(sequences.value), block_tokens.value,
                    (target_f + drafter_f) * sequences.value, seconds.value, int(every.value), terms)
