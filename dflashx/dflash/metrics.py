"""Useful-FLOP counting, throughput and memory for training steps.

FLOPs are counted from shapes (2 per multiply-add) and only for useful work:
  - target forward up to the deepest tapped layer: 2 x (parameters of those layers) per token,
    plus causal attention (QK^T and AV over the keys each query sees) for attention layers;
  - drafter forward + backward (x3): its dense layers on the block tokens, k/v projections and
    `fc` on the context tokens, attention only over the keys each block query may see;
  - the frozen LM head on supervised slots: forward and input-gradient (x2).
Checkpoint recomputation is not useful work and is not counted.

Public API: `TargetCost.of(layers, deepest, text_config).flops(lengths)`, `drafter_flops(...)`, `visible_pairs(anchors, block_size)`,
`peak_memory_bytes()`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dflashx.dflash.config import DFlashConfig


def _attn_width(config: dict) -> int:
    heads = int(config["num_attention_heads"])
    return heads * int(config.get("head_dim") or config["hidden_size"] // heads)


@dataclass(frozen=True)
class TargetCost:
    """The target's shape facts that fix its forward FLOPs up to the deepest tapped layer."""

    params: int  # parameters of decoder layers 0..deepest
    attention_layers: int  # softmax-attention layers among them (linear-attention layers excluded)
    attention_width: int  # heads x head_dim

    @classmethod
    def of(cls, layers: nn.ModuleList, deepest: int, text_config: dict) -> "TargetCost":
        used = list(layers)[: deepest + 1]
        types = list(text_config.get("layer_types") or ["full_attention"] * len(layers))[: deepest + 1]
        return cls(
            params=sum(p.numel() for layer in used for p in layer.parameters()),
            attention_layers=sum(t != "linear_attention" for t in types),
            attention_width=_attn_width(text_config),
        )

    def flops(self, lengths: list[int]) -> float:
        """Forward FLOPs over sequences of `lengths` (causal attention pairs)."""
        pairs = sum(n * (n + 1) / 2 for n in lengths)
        return 2.0 * self.params * sum(lengths) + 4.0 * self.attention_width * pairs * self.attention_layers


def visible_pairs(anchors: torch.Tensor, block_size: int) -> float:
    """Query-key pairs a bidirectional full layer computes: per block, B x (anchor + B)."""
    valid = anchors >= 0
    return float(((anchors.clamp_min(0) + block_size) * block_size * valid).sum())


def drafter_flops(cfg: DFlashConfig, block_tokens: int, context_tokens: int, pairs: float, supervised: int) -> float:
    """Forward+backward FLOPs of one drafter pass (see module docstring)."""
    h, d = cfg.hidden_size, cfg.head_dim
    q_o = 2 * h * cfg.num_attention_heads * d
    kv = 2 * h * cfg.num_key_value_heads * d
    mlp = 3 * h * cfg.intermediate_size
    per_layer = 2.0 * block_tokens * (q_o + kv + mlp) + 2.0 * context_tokens * kv + 4.0 * cfg.num_attention_heads * d * pairs
    fc = 2.0 * context_tokens * cfg.k * h * h
    lm_head = 2.0 * supervised * h * cfg.vocab_size
    return 3.0 * (cfg.num_layers * per_layer + fc) + 2.0 * lm_head


def peak_memory_bytes() -> int:
    """Peak GPU memory allocated, or the process's resident memory without a GPU."""
    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    import psutil

    return int(psutil.Process().memory_info().rss)
