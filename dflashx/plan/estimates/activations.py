"""Peak activation memory of one training sequence, at the longest sample the run can see.

A micro batch is padded to its longest row, and the peak is reached by the longest: a sample of
L = min(stages.train.max_length, stages.tokenize.max_length) tokens (tokenize truncates or drops
longer ones, the trainer cuts at its max_length) with n = min(anchors_per_seq, L) anchors, so
D = n x B drafter block tokens. Per sequence:
  drafter layers   34 x h bytes per token per layer at 16 bits (Korthikanti et al. 2022, "Reducing
                   Activation Recomputation in Large Transformer Models": s b h (34 + 5 a s / h) per
                   layer, whose attention-score term flash attention never stores), scaled by the
                   element size, x D x layers;
  logits           fp32 D x V (the LM head's output over the block tokens);
  captured states  the k tapped target layers' hidden states, k x L x h elements.
Not the mean length: a plan must fit its longest micro batch, not its average one.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.plan.estimates.device import activation_bytes
from dflashx.resolve.model import ResolvedRecipe

KORTHIKANTI_BYTES_PER_TOKEN_PER_H = 34  # per layer and hidden unit, 16-bit elements, flash attention


@dataclass(frozen=True)
class SequenceActivations:
    length: int  # tokens of the longest sample
    drafter_tokens: int  # block tokens of that sample
    drafter_layers: float
    logits: float
    captured: float

    @property
    def total(self) -> float:
        return self.drafter_layers + self.logits + self.captured


def longest_sample(recipe: ResolvedRecipe) -> int:
    """Tokens of the longest training sample: what both tokenize and the trainer let through."""
    return min(recipe.stages.train.max_length, recipe.stages.tokenize.max_length)


def peak_sequence_activations(recipe: ResolvedRecipe) -> SequenceActivations:
    """Activation bytes of one training sequence at the longest sample (see the module doc)."""
    facts, train, drafter = recipe.target.facts, recipe.stages.train, recipe.drafter
    length = longest_sample(recipe)
    tokens = min(train.anchors_per_seq, length) * drafter.block_size
    element = activation_bytes(recipe.target.load_precision)
    per_token_layer = KORTHIKANTI_BYTES_PER_TOKEN_PER_H / 2 * element * facts.hidden_size
    return SequenceActivations(
        length=length, drafter_tokens=tokens,
        drafter_layers=per_token_layer * tokens * drafter.num_layers,
        logits=4.0 * facts.vocab_size * tokens,
        captured=float(len(drafter.target_layer_ids) * length * facts.hidden_size * element),
    )
