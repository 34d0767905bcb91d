"""Training time: the one FLOP model (`dflashx.resolve.flops`) at mean lengths, over peak x MFU.

Per sample, with L the mean training length, n = min(anchors_per_seq, loss tokens) anchors and
B the block size: the target forward to the deepest tapped layer over L tokens, and one drafter
pass over D = n x B block tokens with L context tokens, n x (B - 1) supervised slots and the
block attention pairs of anchors spread evenly over the completion. The trainer logs its MFU with
the same functions on the real lengths and anchors, so `dflashx calibrate` compares like with like.
Time = FLOPs x samples x epochs / (peak BF16 x GPUs x MFU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dflashx.plan.estimates.device import CALIBRATED_MFU, device_of, factor
from dflashx.plan.estimates.tokens import Tokens
from dflashx.plan.explain import Term, term
from dflashx.resolve.flops import DrafterDims, block_pairs, drafter_step_flops, target_forward_flops
from dflashx.resolve.model import ResolvedRecipe


@dataclass(frozen=True)
class Training:
    drafter: DrafterDims
    steps: int
    drafter_tokens_per_sample: float
    flops: float
    seconds: float
    terms: tuple[Term, ...]


def estimate_training(recipe: ResolvedRecipe, tokens: Tokens) -> Training:
    train, hw, facts = recipe.stages.train, recipe.hardware, recipe.target.facts
    drafter = recipe.drafter.dims
    block = recipe.drafter.block_size
    length = tokens.train_len_mean
    loss_tokens = max(length - tokens.prompt_mean, 0.0)
    anchors = min(train.anchors_per_seq, loss_tokens)
    dtoks = anchors * block
    deepest = max(recipe.drafter.target_layer_ids)
    target_f = target_forward_flops(facts, deepest, [length])
    pairs = block_pairs(anchors * (tokens.prompt_mean + loss_tokens / 2), anchors, block)
    drafter_f = drafter_step_flops(drafter, dtoks, length, pairs, anchors * (block - 1))
    per_sample = target_f + drafter_f
    if train.max_steps is not None:
        steps = train.max_steps
        sequences = steps * train.global_batch
    else:
        sequences = tokens.samples * train.epochs
        steps = math.ceil(sequences / train.global_batch)
    total = per_sample * sequences
    dev = device_of(hw)
    mfu, calibrated = factor(hw, CALIBRATED_MFU, hw.training.mfu)
    seconds = total / (train.peak_flops * dev.count * mfu)
    terms = (
        term("train.drafter_params", drafter.trainable, "params",
             "num_layers x (2 h q + 2 h kv + 3 h ffn) + k h^2 (fc)",
             layer_params=drafter.layer_params, fc_params=drafter.fc_params, num_layers=drafter.num_layers),
        term("train.drafter_tokens_per_sample", dtoks, "tokens",
             "min(anchors_per_seq, mean loss tokens) x block_size",
             anchors_per_seq=train.anchors_per_seq, loss_tokens=loss_tokens, block_size=block),
        term("train.flops_per_sample", per_sample, "FLOP",
             "target forward to the deepest tapped layer over L + drafter forward/backward over D block tokens "
             "and L context tokens + frozen LM head on the supervised slots (dflashx.resolve.flops)",
             target=target_f, drafter_and_head=drafter_f, L=length, last_target_layer=deepest,
             source="Kaplan et al. 2020 (2N forward / 6N training FLOPs per token), plus attention"),
        term("train.steps", steps, "optimizer steps", "max_steps, else ceil(samples x epochs / global_batch)",
             samples=tokens.samples, epochs=train.epochs, global_batch=train.global_batch),
        term("train.seconds", seconds, "s", "FLOPs per sample x sequences / (peak x GPUs x MFU)",
             sequences=sequences, peak_flops=train.peak_flops, gpus=dev.count, mfu=mfu,
             mfu_source="calibrated (hardware.calibrated.training_mfu)" if calibrated else "profile default"),
    )
    return Training(drafter, steps, dtoks, total, seconds, terms)
