"""Useful-FLOP counting, throughput and memory for training steps.

FLOPs are counted from shapes (2 per multiply-add) and only for useful work:
  - target forward up to the deepest tapped layer: 2 x (parameters of those layers) per token,
    plus causal attention (QK^T and AV over the keys each query sees) for attention layers;
  - drafter forward + backward (x3): its dense layers on the block tokens, k/v projections and
    `fc` on the context tokens, attention only over the keys each block query may see;
  - the frozen LM head on supervised slots: forward and input-gradient (x2).
Checkpoint recomputation is not useful work and is not counted.

Public API: `target_flops(...)`, `drafter_flops(...)`, `visible_pairs(anchors, block_size)`,
`peak_memory_bytes()`, `Throughput`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn

from dflashx.dflash.config import DFlashConfig


def _attn_width(config: dict) -> int:
    heads = int(config["num_attention_heads"])
    return heads * int(config.get("head_dim") or config["hidden_size"] // heads)


def target_flops(layers: nn.ModuleList, deepest: int, text_config: dict, lengths: list[int]) -> float:
    """Forward FLOPs of the target's layers 0..deepest over sequences of `lengths`."""
    params = sum(p.numel() for layer in list(layers)[: deepest + 1] for p in layer.parameters())
    types = list(text_config.get("layer_types") or ["full_attention"] * len(layers))[: deepest + 1]
    n_attn = sum(t != "linear_attention" for t in types)
    width = _attn_width(text_config)
    tokens = sum(lengths)
    pairs = sum(n * (n + 1) / 2 for n in lengths)
    return 2.0 * params * tokens + 4.0 * width * pairs * n_attn


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


@dataclass
class Throughput:
    """Accumulates tokens and FLOPs between two log points."""

    peak_tflops: float
    tokens: float = 0.0
    flops: float = 0.0
    _start: float = field(default_factory=time.perf_counter)

    def add(self, tokens: float, flops: float) -> None:
        self.tokens += tokens
        self.flops += flops

    def read_and_reset(self) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        tflops = self.flops / elapsed / 1e12
        out = {"tokens_per_s": self.tokens / elapsed, "tflops": tflops, "mfu": tflops / self.peak_tflops}
        self.tokens = self.flops = 0.0
        self._start = time.perf_counter()
        return out
