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
from typing import Any

from dflashx.plan.estimates.decode import dense_read_bytes
from dflashx.plan.estimates.speculative import drafter_window
from dflashx.plan.estimates.device import CALIBRATED_MFU, CALIBRATED_TAU_PROBE, device_of, factor
from dflashx.plan.estimates.gather import target_gather
from dflashx.plan.estimates.gradsync import grad_sync
from dflashx.plan.estimates.host import batch1_seconds_per_token, in_process_tokens_per_s
from dflashx.plan.estimates.lengths import Lengths
from dflashx.plan.estimates.mfu import mfu_row
from dflashx.plan.estimates.speculative import dflash_drafter
from dflashx.plan.estimates.moe import touched_bytes, trainer_moe
from dflashx.plan.estimates.tokens import Tokens
from dflashx.plan.explain import Term, term
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
    """(target FLOPs, drafter + LM head FLOPs, drafter block tokens) per sample, averaged over samples
    of these output lengths."""
    train, facts, block = recipe.stages.train, recipe.target.facts, recipe.drafter.block_size
    target = target_pass_flops(facts, recipe.drafter.target_layer_ids, train.labels, [prompt + o for o in outputs],
                               sum(outputs))
    drafter = tokens = 0.0
    for output in outputs:
        anchors = min(train.anchors_per_seq, output)
        pairs = block_pairs(anchors * (prompt + output / 2), anchors, block)
        drafter += drafter_step_flops(recipe.drafter.dims, anchors * block, prompt + output, pairs,
                                      anchors * (block - 1))
        tokens += anchors * block
    n = len(outputs)
    return target / n, drafter / n, tokens / n


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
    if recipe.hardware.gpu is None:
        per_token = 1 / in_process_tokens_per_s(recipe, [0.0] * (block - 1))
        inputs: dict[str, Any] = {}
    else:
        facts, dtype = recipe.target.facts, recipe.target.load_precision
        inputs = {"dense_bytes": dense_read_bytes(facts, dtype),
                  "routed_bytes": facts.num_moe_layers * touched_bytes(facts, block, dtype),
                  "drafter_bytes": dflash_drafter(recipe, recipe.drafter.dims, block, drafter_window(recipe),
                                                  1.0).weight_bytes}
        per_token = batch1_seconds_per_token(recipe, sum(inputs.values()), 1)
    return term("train.tau_probe_seconds", train.tau_prompts * output * per_token, "s",
                "tau_prompts x output tokens (mean, capped at tau_max_new_tokens) x seconds per token at batch 1 "
                "and τ 1 (GPU: (target dense weights + experts touched by block_size verified tokens + drafter "
                "weights) / (bandwidth x efficiency); CPU: the in-process decoder)",
                tau_prompts=train.tau_prompts, output_tokens=output, seconds_per_token=per_token, block_size=block,
                **inputs)


def estimate_training(recipe: ResolvedRecipe, tokens: Tokens, lengths: Lengths) -> Training:
    train, hw, facts = recipe.stages.train, recipe.hardware, recipe.target.facts
    drafter = recipe.drafter.dims
    outputs = sample_lengths(lengths, tokens.output_room)
    target_f, drafter_f, dtoks = flops_per_sample(recipe, tokens.prompt_mean, outputs)
    per_sample = target_f + drafter_f
    batch = effective_batch(train.micro_batch, train.grad_accum, train.world_size)
    per_epoch = steps_per_epoch(tokens.samples, train.micro_batch, train.grad_accum, train.world_size)
    steps = optimizer_steps(per_epoch, train.epochs, train.max_steps)
    sequences = steps * batch
    total = per_sample * sequences
    dev = device_of(hw)
    row = mfu_row(hw, recipe.target.load_precision, facts.num_linear_layers > 0)
    mfu, calibrated = factor(hw, CALIBRATED_MFU, row.mfu)
    sync = grad_sync(recipe, drafter.trainable)
    sync_s = 0.0 if calibrated else sync.seconds * steps
    gather = target_gather(recipe)
    gather_s = 0.0 if calibrated else gather.seconds_per_micro_step * steps * train.grad_accum
    deepest = facts.num_layers - 1 if train.labels == "target" else max(recipe.drafter.target_layer_ids)
    moe = trainer_moe(facts, deepest, [tokens.prompt_mean + o for o in outputs], train.micro_batch,
                      "fp8" if recipe.target.load_precision == "fp8" else "bf16", dev)
    moe_s = 0.0 if calibrated else moe.seconds * sequences / dev.count
    dense_flops = total - (0.0 if calibrated else moe.routed_flops * sequences)
    compute_s = dense_flops / (train.peak_flops * dev.count * mfu) + moe_s
    probe = tau_probe(recipe, lengths)
    rest_s = compute_s + sync_s + gather_s  # what TAU_SHARE is a share of
    every = tau_every(train.tau_every, measurable(train), steps, rest_s, probe.value)
    tau_s = measurements(steps, every) * probe.value
    seconds = rest_s + tau_s
    mfu_source = ("measured on this node: hardware.calibrated.training_mfu (includes the gradient sync)" if calibrated
                  else f"{row.generation}/{row.precision}/{row.kind}: {row.source}"
                  + (f" — borrowed: {row.borrowed}" if row.borrowed else ""))
    modules = drafter.modules  # the architecture's own (DFlash2: convolutions and selector; none for DFlash)
    terms = (
        term("train.drafter_params", drafter.trainable, "params",
             "num_layers x (2 h q + 2 h kv + 3 h ffn) + k h^2 (fc) + norms (num_layers x (2 h + 2 head_dim) + 2 h)"
             + modules.params_text,
             layer_params=drafter.layer_params, fc_params=drafter.fc_params, norm_params=drafter.norm_params,
             num_layers=drafter.num_layers, adamw_params=drafter.adamw_params,
             **modules.param_inputs),
        term("train.drafter_tokens_per_sample", dtoks, "tokens",
             "E[min(anchors_per_seq, loss tokens)] x block_size over the length distribution",
             anchors_per_seq=train.anchors_per_seq, block_size=recipe.drafter.block_size),
        term("train.flops_per_sample", per_sample, "FLOP",
             f"mean over {QUADRATURE} quantiles of the training length L: target forward to the deepest tapped layer "
             "(labels: target — to its last layer, plus its LM head on the supervised positions) over L + drafter "
             "forward/backward over the block tokens and L context tokens + frozen LM head on the supervised slots "
             + modules.flops_text + "(dflashx.resolve.flops)",
             target=target_f, drafter_and_head=drafter_f, L_mean=tokens.train_len_mean,
             **modules.flop_inputs,
             last_target_layer=max(recipe.drafter.target_layer_ids), labels=train.labels,
             source="Kaplan et al. 2020 (2N forward / 6N training FLOPs per token), plus attention"),
        term("train.steps", steps, "optimizer steps", "max_steps, else ceil(epochs x steps per epoch), a step per "
             "effective batch of the samples each rank's sampler keeps (dflashx.resolve.formulas, as the trainer "
             "counts)",
             samples=tokens.samples, epochs=train.epochs, steps_per_epoch=per_epoch, effective_batch=batch,
             global_batch=train.global_batch),
        sync.term,
        gather.term,
        probe,
        term("train.tau_seconds", tau_s, "s",
             "held-out τ measurements (ceil(steps / tau_every): every tau_every steps and at the last) x one "
             "measurement; tau_every unset: the smallest interval keeping them within tau_share of the rest",
             tau_every=every, given=train.tau_every, measurements=measurements(steps, every),
             tau_share=TAU_SHARE, share_of_rest=tau_s / rest_s if rest_s else 0.0),
        term("train.seconds", seconds, "s",
             "(FLOPs per sample - routed experts) x sequences / (peak x GPUs x MFU) + MoE layers (moe.py) "
             "+ steps x gradient sync + steps x grad_accum x target gather + held-out τ measurements",
             sequences=sequences, peak_flops=train.peak_flops, gpus=dev.count, mfu=mfu, mfu_source=mfu_source,
             compute_s=compute_s, moe_s=moe_s, moe_routed_flops_per_sample=moe.routed_flops,
             moe_layer=moe.layer.inputs() if moe.layer else None, grad_sync_s=sync_s, target_gather_s=gather_s,
             tau_s=tau_s,
             calibrated=calibrated),
    )
    return Training(drafter, steps, sequences, dtoks, total, seconds, every, terms)
