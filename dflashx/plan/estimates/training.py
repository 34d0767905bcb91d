"""Training time: target forward to the last captured layer + drafter forward/backward, over peak x MFU.

FLOPs per sample (Kaplan et al. 2020: 2 FLOPs per parameter per token forward, 6 forward+backward):
  target   = 2 x params(layers 0..max(target_layer_ids)) x L            (frozen, no backward)
  drafter  = 6 x drafter layer params x D + 6 x fc params x L
  lm head  = 4 x hidden x vocab x D   (frozen head: forward + input gradient only)
with L the mean training length and D = min(anchors_per_seq, loss tokens) x block_size drafter
tokens. Time = FLOPs x samples x epochs / (peak BF16 x GPUs x MFU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dflashx.config.schema import Recipe
from dflashx.plan.derive import Derived
from dflashx.plan.estimates.device import CALIBRATED_MFU, device_of, factor
from dflashx.plan.estimates.tokens import Tokens
from dflashx.plan.explain import Term, term
from dflashx.targets.registry import TargetFacts


@dataclass(frozen=True)
class Drafter:
    layer_params: int  # one drafter decoder layer
    fc_params: int  # fuses k target layers into the hidden size
    num_layers: int

    @property
    def trainable(self) -> int:
        return self.num_layers * self.layer_params + self.fc_params


def drafter_size(recipe: Recipe, facts: TargetFacts) -> Drafter:
    """Drafter layers use the target's hidden size and attention geometry (no output gate)."""
    d, h = recipe.drafter, facts.hidden_size
    q = facts.num_attention_heads * facts.head_dim
    attention = 2 * h * q + 2 * h * facts.num_kv_heads * facts.head_dim
    mlp = 3 * h * (d.intermediate_size or facts.intermediate_size)
    return Drafter(attention + mlp, d.num_target_layers * h * h, d.num_layers)


@dataclass(frozen=True)
class Training:
    drafter: Drafter
    steps: int
    drafter_tokens_per_sample: float
    flops: float
    seconds: float
    terms: tuple[Term, ...]


def estimate_training(recipe: Recipe, facts: TargetFacts, tokens: Tokens, derived: Derived) -> Training:
    train, hw = recipe.stages.train, recipe.hardware
    drafter = drafter_size(recipe, facts)
    length = tokens.train_len_mean
    loss_tokens = max(length - tokens.prompt_mean, 0.0)
    dtoks = min(train.anchors_per_seq, loss_tokens) * recipe.drafter.block_size
    last = max(derived.target_layer_ids) if derived.target_layer_ids else facts.num_layers - 1
    target_f = 2 * facts.params_through_layer(last) * length
    drafter_f = 6 * drafter.num_layers * drafter.layer_params * dtoks + 6 * drafter.fc_params * length
    head_f = 4 * facts.hidden_size * facts.vocab_size * dtoks
    per_sample = target_f + drafter_f + head_f
    if train.max_steps is not None:
        steps = train.max_steps
        sequences = steps * train.global_batch
    else:
        sequences = tokens.samples * train.epochs
        steps = math.ceil(sequences / train.global_batch)
    total = per_sample * sequences
    dev = device_of(hw)
    mfu, calibrated = factor(hw, CALIBRATED_MFU, hw.training.mfu)
    precision = "bf16" if hw.gpu is not None else "fp32"
    seconds = total / (dev.peak_flops(precision) * dev.count * mfu)
    terms = (
        term("train.drafter_params", drafter.trainable, "params",
             "num_layers x (2 h q + 2 h kv + 3 h ffn) + k h^2 (fc)",
             layer_params=drafter.layer_params, fc_params=drafter.fc_params, num_layers=drafter.num_layers),
        term("train.drafter_tokens_per_sample", dtoks, "tokens",
             "min(anchors_per_seq, mean loss tokens) x block_size",
             anchors_per_seq=train.anchors_per_seq, loss_tokens=loss_tokens, block_size=recipe.drafter.block_size),
        term("train.flops_per_sample", per_sample, "FLOP",
             "2 x target params to last layer x L + 6 x drafter layers x D + 6 x fc x L + 4 x h x V x D",
             target=target_f, drafter=drafter_f, lm_head=head_f, L=length, last_target_layer=last,
             source="Kaplan et al. 2020 (2N forward / 6N training FLOPs per token)"),
        term("train.steps", steps, "optimizer steps", "max_steps, else ceil(samples x epochs / global_batch)",
             samples=tokens.samples, epochs=train.epochs, global_batch=train.global_batch),
        term("train.seconds", seconds, "s", "FLOPs per sample x sequences / (peak x GPUs x MFU)",
             sequences=sequences, peak_flops=dev.peak_flops(precision), gpus=dev.count, mfu=mfu,
             mfu_source="calibrated (hardware.calibrated.training_mfu)" if calibrated else "profile default"),
    )
    return Training(drafter, steps, dtoks, total, seconds, terms)
