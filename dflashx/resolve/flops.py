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
           `fc` on the context tokens, attention over the keys each block query may see; the
           architecture's modules per layer on the block tokens and per supervised slot (DFlash2's
           two convolutions and its path selector: `module_flops_per_token`, `module_flops_per_slot`);
  lm head  frozen: forward and input gradient (x2) on the supervised slots.
Checkpoint recomputation is not useful work and is not counted (Kaplan et al. 2020 for the
2N / 6N rule; nanoGPT's MFU counts the same way).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dflashx.config.architectures import architecture
from dflashx.config.architectures.dflash import NO_MODULES
from dflashx.config.architectures.spec import ModuleFigures, Shapes
from dflashx.targets.registry import TargetFacts


@dataclass(frozen=True)
class DrafterDims:
    """The shapes that fix a DFlash drafter's FLOPs and parameter count, and its architecture's own modules'
    figures (`modules`: none for DFlash; `drafter_dims` asks the architecture). An architecture's own figures read
    through (`dims.codebook_params` of a DFlash2 drafter)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    k: int  # tapped target layers fused by `fc`
    modules: ModuleFigures = NO_MODULES

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "modules":
            raise AttributeError(name)
        return getattr(self.modules, name)

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
        """One decoder layer's projection matrices (norms and the architecture's modules left out)."""
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
    def matrices(self) -> int:
        """The weight matrices every supervised slot's gradient reaches whole: the layers' projections, `fc`, and the
        architecture's (DFlash2's kernel and hidden projections: not its codebooks, of which a slot reaches k + 1
        rows; not the norm and base-kernel vectors). For DFlash this is the count the tiny ablation's slots per
        parameter were measured in (`plan.rules_training`)."""
        return self.num_layers * self.layer_params + self.fc_params + self.modules.matrices

    @property
    def adamw_params(self) -> int:
        """What a Muon run leaves to the auxiliary AdamW: the norm vectors and the architecture's (DFlash2's base
        kernels and codebooks, embedding tables), as the trainer groups them (`dflash.job.parameter_groups`)."""
        return self.norm_params + self.modules.vectors

    @property
    def trainable(self) -> int:
        """Every parameter of the built drafter, sum(p.numel()): what its model states, checkpoints,
        gradient all-reduce and exported weights hold (tests/test_drafter_params.py builds it and counts)."""
        return self.matrices + self.adamw_params


class _Drafter(Protocol):
    """A drafter description: the resolved recipe's (`ResolvedDrafter`) or a checkpoint's (`DFlashConfig`)."""

    @property
    def architecture(self) -> str: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def num_attention_heads(self) -> int: ...
    @property
    def num_key_value_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...


def drafter_dims(d: _Drafter, k: int) -> DrafterDims:
    """The dims of a drafter description with `k` tapped layers, its architecture's modules asked of its entry."""
    shapes = Shapes(d.num_layers, d.hidden_size, d.vocab_size, d.block_size)
    return DrafterDims(d.num_layers, d.hidden_size, d.num_attention_heads, d.num_key_value_heads, d.head_dim,
                       d.intermediate_size, d.vocab_size, k, architecture(d.architecture).module_figures(shapes, d))


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


def module_flops_per_token(dims: DrafterDims) -> float:
    """Forward FLOPs of one layer's architecture modules per block token (0 for DFlash; DFlash2's two convolutions,
    `config.architectures.dflash2.conv_flops_per_token`)."""
    return dims.modules.layer_flops_per_token


def module_flops_per_slot(dims: DrafterDims) -> float:
    """Forward FLOPs of the architecture's modules per supervised slot (0 for DFlash; DFlash2's path selector,
    `config.architectures.dflash2.selector_flops_per_slot`)."""
    return dims.modules.slot_flops


# DFlash2's names for them (tests/test_plan_dflash2.py)
dflash2_layer_flops_per_token, selector_flops_per_slot = module_flops_per_token, module_flops_per_slot


def drafter_step_flops(dims: DrafterDims, block_tokens: float, context_tokens: float, pairs: float,
                       supervised: float) -> float:
    """Forward + backward FLOPs of one drafter pass and its frozen LM head (see module doc); the architecture's
    modules per layer on every block token and per supervised slot (DFlash2's convolutions and selector), both
    trained (x3)."""
    h, width = dims.hidden_size, dims.num_attention_heads * dims.head_dim
    per_layer = (2.0 * block_tokens * dims.layer_params + 2.0 * context_tokens * dims.kv_params
                 + 4.0 * width * pairs + block_tokens * module_flops_per_token(dims))
    fc = 2.0 * context_tokens * dims.fc_params
    selector = supervised * module_flops_per_slot(dims)
    lm_head = 2.0 * supervised * h * dims.vocab_size
    return 3.0 * (dims.num_layers * per_layer + fc + selector) + 2.0 * lm_head


def block_pairs(anchor_positions_sum: float, anchors: float, block_size: int) -> float:
    """Query-key pairs of the drafter's bidirectional blocks: per block, B x (anchor + B)."""
    return (anchor_positions_sum + anchors * block_size) * block_size
