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
           `fc` on the context tokens, attention over the keys each block query may see; DFlash2's
           two convolutions per layer on the block tokens and its path selector on the supervised
           slots (`dflash2_layer_flops_per_token`, `selector_flops_per_slot`);
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
        """One decoder layer's projection matrices (norms and DFlash2's modules left out)."""
        return self.q_o_params + self.kv_params + self.mlp_params

    @property
    def fc_params(self) -> int:
        return self.k * self.hidden_size * self.hidden_size

    @property
    def norm_params(self) -> int:
        """RMSNorm weights: per layer input_layernorm and post_attention_layernorm (h each) and the
        per-head q_norm and k_norm (head_dim each); `hidden_norm` and the final `norm` (h each)."""
        return self.num_layers * (2 * self.hidden_size + 2 * self.head_dim) + 2 * self.hidden_size

    @property
    def conv_groups(self) -> int:
        """G = h / conv_group_size channel groups of a DFlash2 convolution (0: DFlash)."""
        return self.hidden_size // self.conv_group_size if self.conv_kernel_size else 0

    @property
    def conv_projection_params(self) -> int:
        """One convolution's `kernel_projection`, Linear(h -> 2 K G): both sides' K taps per group."""
        return self.hidden_size * 2 * self.conv_kernel_size * self.conv_groups

    @property
    def conv_base_params(self) -> int:
        """One convolution's `base_kernel` [2, K, h]."""
        return 2 * self.conv_kernel_size * self.hidden_size if self.conv_kernel_size else 0

    @property
    def conv_params(self) -> int:
        """DFlash2's convolutions: two per layer (`attention_conv`, `mlp_conv`)."""
        return self.num_layers * 2 * (self.conv_projection_params + self.conv_base_params)

    @property
    def codebook_params(self) -> int:
        """The selector's `predecessor_codebook` and `successor_codebook`, V x r each."""
        return 2 * self.vocab_size * self.selector_rank

    @property
    def selector_projection_params(self) -> int:
        """The selector's `hidden_projection`, Linear(h -> r)."""
        return self.hidden_size * self.selector_rank

    @property
    def selector_params(self) -> int:
        return self.codebook_params + self.selector_projection_params

    @property
    def matrices(self) -> int:
        """The weight matrices every supervised slot's gradient reaches whole: the layers' projections,
        `fc`, and DFlash2's kernel and hidden projections (not the codebooks, of which a slot reaches
        k + 1 rows; not the norm and base-kernel vectors). For DFlash this is the count the tiny
        ablation's slots per parameter were measured in (`plan.rules_training`)."""
        return (self.num_layers * (self.layer_params + 2 * self.conv_projection_params) + self.fc_params
                + self.selector_projection_params)

    @property
    def adamw_params(self) -> int:
        """What a Muon run leaves to the auxiliary AdamW: the norm vectors, the convolutions' base kernels
        and the codebooks (embedding tables), as the trainer groups them (`dflash.job.parameter_groups`)."""
        return self.norm_params + self.num_layers * 2 * self.conv_base_params + self.codebook_params

    @property
    def trainable(self) -> int:
        """Every parameter of the built drafter, sum(p.numel()): what its model states, checkpoints,
        gradient all-reduce and exported weights hold (tests/test_drafter_params.py builds it and counts)."""
        return self.matrices + self.adamw_params


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
    return (2.0 * facts.params_through_layer(deepest, active=True) * sum(lengths)
            + attention_flops(facts, lengths) * attention_layers)


def attention_flops(facts: TargetFacts, lengths: Sequence[float]) -> float:
    """One attention layer's softmax attention over sequences of `lengths` tokens: QK^T and AV, 4 x heads x
    head_dim per visible (causal) pair."""
    return 4.0 * facts.num_attention_heads * facts.head_dim * causal_pairs(lengths)


def target_pass_flops(facts: TargetFacts, layer_ids: Sequence[int], labels: str, lengths: Sequence[float],
                      label_tokens: float) -> float:
    """The target's part of a training step: forward to the deepest tapped layer for `labels: data`;
    for `labels: target` to its last layer, plus its LM head on the `label_tokens` supervised positions
    (2 x hidden x vocab each) for the argmax labels."""
    if labels == "target":
        return (target_forward_flops(facts, facts.num_layers - 1, lengths)
                + 2.0 * facts.hidden_size * facts.vocab_size * label_tokens)
    return target_forward_flops(facts, max(layer_ids), lengths)


def dflash2_layer_flops_per_token(dims: DrafterDims) -> float:
    """Forward FLOPs of one layer's two DFlash2 convolutions per block token (0 for DFlash):
      kernel projections  2 x h x 2 K G per convolution (one Linear(h -> 2 K G) on the normalised
                          sublayer input gives both sides' dynamic kernels);
      convolution         per side, one multiply-add per tap and channel, out[t, c] = sum_o (base[o, c]
                          + d[t, o, c // group]) x[t - o, c]: 2 K h per side, two sides per convolution
                          (the kernel sum base + d is elementwise, not a multiply-add, and is not counted,
                          as norms and activations are not)."""
    k, h = dims.conv_kernel_size, dims.hidden_size
    return 2 * (2.0 * dims.conv_projection_params + 2 * 2.0 * k * h)


def selector_flops_per_slot(dims: DrafterDims) -> float:
    """Forward FLOPs of DFlash2's path selector per scored slot (0 for DFlash), S(a, b) = U(b) + <A[a] *
    P(h), B[b]> over the k candidates b of the slot, predecessor a:
      hidden projection   P(h): 2 h r;
      predecessor         A[a] * P(h): r multiplies (a row gather of A, no arithmetic);
      pair scores         k dot products with the successor rows B[b]: 2 k r;
      unary               U(b) added to each: k (the top-k of the logits is a selection over the V
                          logits the LM head already produced and gathers k of them: no multiply-add)."""
    h, r, k = dims.hidden_size, dims.selector_rank, dims.selector_top_k
    return 2.0 * h * r + r + 2.0 * k * r + k if r else 0.0


def drafter_step_flops(dims: DrafterDims, block_tokens: float, context_tokens: float, pairs: float,
                       supervised: float) -> float:
    """Forward + backward FLOPs of one drafter pass and its frozen LM head (see module doc); DFlash2's
    convolutions run on every block token, its selector on the supervised slots, both trained (x3)."""
    h, width = dims.hidden_size, dims.num_attention_heads * dims.head_dim
    per_layer = (2.0 * block_tokens * dims.layer_params + 2.0 * context_tokens * dims.kv_params
                 + 4.0 * width * pairs + block_tokens * dflash2_layer_flops_per_token(dims))
    fc = 2.0 * context_tokens * dims.fc_params
    selector = supervised * selector_flops_per_slot(dims)
    lm_head = 2.0 * supervised * h * dims.vocab_size
    return 3.0 * (dims.num_layers * per_layer + fc + selector) + 2.0 * lm_head


def block_pairs(anchor_positions_sum: float, anchors: float, block_size: int) -> float:
    """Query-key pairs of the drafter's bidirectional blocks: per block, B x (anchor + B)."""
    return (anchor_positions_sum + anchors * block_size) * block_size
