"""Training-step figures measured on tensors: block attention pairs and peak memory.

FLOPs themselves come from the one FLOP model, `dflashx.resolve.flops` (shapes only, so an FP8
target counts as much as a bf16 one); this module feeds it what a real batch holds.

Public API: `step_flops(facts, config, lengths, blocks, labels, label_tokens)`, `visible_pairs(anchors, block_size)`,
`peak_memory_bytes()`.
"""

from __future__ import annotations

import torch

from dflashx.dflash.anchors import BlockBatch
from dflashx.dflash.config import DFlashConfig
from dflashx.resolve.flops import block_pairs, drafter_step_flops, target_pass_flops
from dflashx.targets.registry import TargetFacts


def visible_pairs(anchors: torch.Tensor, block_size: int) -> float:
    """Query-key pairs a bidirectional full layer computes: per block, B x (anchor + B)."""
    valid = anchors >= 0
    return block_pairs(float(anchors.clamp_min(0)[valid].sum()), float(valid.sum()), block_size)


def step_flops(facts: TargetFacts, config: DFlashConfig, lengths: list[int], blocks: BlockBatch,
               labels: str = "data", label_tokens: int = 0) -> float:
    """Useful FLOPs of one micro step: the target's pass (to the deepest tapped layer; with `labels:
    target` to its head on the `label_tokens` supervised positions) and the drafter pass, over the
    real tokens and blocks (padding of the batch, and of buckets for a compiled drafter, is waste)."""
    blocks_tokens = int((blocks.anchors >= 0).sum()) * config.block_size
    drafter = drafter_step_flops(config.dims, blocks_tokens, sum(lengths),
                                 visible_pairs(blocks.anchors, config.block_size), int((blocks.weights > 0).sum()))
    return target_pass_flops(facts, config.target_layer_ids, labels, lengths, label_tokens) + drafter


def peak_memory_bytes() -> int:
    """Peak GPU memory allocated, or the process's resident memory without a GPU."""
    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    import psutil

    return int(psutil.Process().memory_info().rss)
