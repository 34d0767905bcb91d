"""The one FLOP model: useful FLOPs of an online DFlash training step, from shapes alone.

Every MFU figure in dflashx (the planner's training estimate, the trainer's logged TFLOP/s and
MFU, calibration, the benchmark) is computed here. FLOPs are counted from the architecture's
shapes (2 per multiply-add), never from module parameters, so a target converted to FP8 (whose
weights live in buffers) counts the same as in bf16.

  target   forward up to the deepest tapped layer: 2 x active params(layers 0..deepest) per token
           (an MoE layer counts its router, shared experts and the top-k routed experts a token
           runs through, not the idle ones: Fedus et al. 2022, Switch Transformer, sec. 2), plus
           causal softmax attention (QK^T and AV: 4 x heads x head_dim per visible pair) in its
           attention layers (Gated DeltaNet layers count their projections only); with the
           target's argmax as labels (`stages.train.labels: target`) every layer, and its LM head
           on the supervised positions;
  drafter  forward + backward (x3): its dense layers on the block tokens, k/v projections and
           `fc` on the context tokens, attention over the keys each block query may see;
  lm head  frozen: forward and input gradient (x2) on the supervised slots.
Checkpoint recomputation is not useful work and is not counted (Kaplan et al. 2020 for the
2N / 6N rule; nanoGPT's MFU counts the same way).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from dflashx.targets.registry import TargetFacts


@dataclass(frozen=True)
class DrafterDims:
    """The shapes that fix a DFlash drafter's FLOPs and parameter count."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    k: int  # tapped target layers fused by `fc`
    # DFlash2's modules (0: DFlash, which has none): the convolutions' taps and channels per group, the
    # selector's rank and candidates
    conv_kernel_size: int = 0
    conv_group_size: int = 1
    selector_rank: int = 0
    selector_top_k: int = 0

    @property
    def q_o_params(self) -> int:
        return 2 * self.hidden_size * self.num_attention_heads * self.head_dim

    @property
    def kv_params(self) -> int:
        return 2 * self.hidden_size * self.num_key_value_heads * self.head_dim

    @property
    def mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def layer_params(self) -> int:
        """One decoder layer's weights (norms left out)."""
        return self.q_o_params + self.kv_params + self.mlp_params

    @property
    def fc_params(self) -> int:
        return self.k * self.hidden_size * self.hidden_size

    @property
    def trainable(self) -> int:
        return self.num_layers * self.layer_params + self.fc_params


class _DFlash2Keys(Protocol):
    @property
    def architecture(self) -> str: ...
    @property
    def conv_kernel_size(self) -> int: ...
    @property
    def conv_group_size(self) -> int: ...
    @property
    def selector_rank(self) -> int: ...
    @property
    def selector_top_k(self) -> int: ...


def dflash2_dims(drafter: _DFlash2Keys) -> dict[str, int]:
    """The DrafterDims fields of DFlash2's modules for a drafter description (the resolved recipe's or a
    checkpoint's config); none for DFlash."""
    if drafter.architecture != "dflash2":
        return {}
    return {"conv_kernel_size": drafter.conv_kernel_size, "conv_group_size": drafter.conv_group_size,
            "selector_rank": drafter.selector_rank, "selector_top_k": drafter.selector_top_k}


def causal_pairs(lengths: Sequence[float]) -> float:
    """Query-key pairs of causal attention over sequences of these lengths."""
    return sum(n * (n + 1) / 2 for n in lengths)


def target_forward_flops(facts: TargetFacts, deepest: int, lengths: Sequence[float]) -> float:
    """Forward FLOPs of target layers 0..deepest over sequences of `lengths` tokens."""
    attention_layers = sum(t != "linear_attention" for t in facts.types[: deepest + 1])
    width = facts.num_attention_heads * facts.head_dim
    return (2.0 * facts.params_through_layer(deepest, active=True) * sum(lengths)
            + 4.0 * width * causal_pairs(lengths) * attention_layers)


def target_pass_flops(facts: TargetFacts, layer_ids: Sequence[int], labels: str, lengths: Sequence[float],
                      label_tokens: float) -> float:
    """The target's part of a training step: forward to the deepest tapped layer for `labels: data`;
    for `labels: target` to its last layer, plus its LM head on the `label_tokens` supervised positions
    (2 x hidden x vocab each) for the argmax labels."""
    if labels == "target":
        return (target_forward_flops(facts, facts.num_layers - 1, lengths)
                + 2.0 * facts.hidden_size * facts.vocab_size * label_tokens)
    return target_forward_flops(facts, max(layer_ids), lengths)


def drafter_step_flops(dims: DrafterDims, block_tokens: float, context_tokens: float, pairs: float,
                       supervised: float) -> float:
    """Forward + backward FLOPs of one drafter pass and its frozen LM head (see module doc)."""
    h, width = dims.hidden_size, dims.num_attention_heads * dims.head_dim
    per_layer = (2.0 * block_tokens * dims.layer_params + 2.0 * context_tokens * dims.kv_params
                 + 4.0 * width * pairs)
    fc = 2.0 * context_tokens * dims.fc_params
    lm_head = 2.0 * supervised * h * dims.vocab_size
    return 3.0 * (dims.num_layers * per_layer + fc) + 2.0 * lm_head


def block_pairs(anchor_positions_sum: float, anchors: float, block_size: int) -> float:
    """Query-key pairs of the drafter's bidirectional blocks: per block, B x (anchor + B)."""
    return (anchor_positions_sum + anchors * block_size) * block_size
