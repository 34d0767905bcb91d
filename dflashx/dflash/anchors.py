"""Anchor sampling and the block batch a drafter pass trains on.

An anchor is a position a whose token starts a block [input_ids[a], MASK x (B-1)]. Anchors are
drawn only where the anchor token and the next token both carry loss (so every block has at least
one supervised slot and starts inside an assistant turn), without replacement, up to
`anchors_per_seq` per sequence (fewer for short ones), and re-drawn every epoch: the draw is seeded
by (seed, epoch, sample index), so a resumed run draws the same anchors.

Public API: `valid_anchor_positions(loss_mask)`, `sample_anchors(loss_mask, n, seed, epoch, index)`,
`BlockBatch`, `build_block_batch(input_ids, loss_mask, anchors, block_size, mask_token_id, gamma,
pad_blocks_to, label_ids)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dflashx.dflash.loss import block_labels
from dflashx.dflash.model import block_input_ids


def valid_anchor_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """Positions a with loss_mask[a] and loss_mask[a + 1] both set (1-D mask)."""
    m = loss_mask.bool()
    return torch.nonzero(m[:-1] & m[1:]).flatten()


def sample_anchors(loss_mask: torch.Tensor, n: int, seed: int, epoch: int, index: int) -> torch.Tensor:
    """Up to n sorted anchors for one sequence, drawn without replacement, reproducibly."""
    valid = valid_anchor_positions(loss_mask)
    if len(valid) <= n:
        return valid
    rng = np.random.default_rng([seed, epoch, index])
    pick = np.sort(rng.choice(len(valid), size=n, replace=False))
    return valid[torch.from_numpy(pick)]


@dataclass
class BlockBatch:
    """Everything one drafter pass needs for a padded batch of sequences.

    anchors [b, n] (-1 = padding), block_ids / block_positions / labels / weights [b, n*B];
    labels are same-position (slot k -> input_ids[anchor + k]); weights are 0 where no loss.
    """

    anchors: torch.Tensor
    block_ids: torch.Tensor
    block_positions: torch.Tensor
    labels: torch.Tensor
    weights: torch.Tensor

    def to(self, device: torch.device | str) -> "BlockBatch":
        return BlockBatch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def build_block_batch(
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    anchors: list[torch.Tensor],
    block_size: int,
    mask_token_id: int,
    gamma: float,
    pad_blocks_to: int = 1,
    label_ids: torch.Tensor | None = None,
) -> BlockBatch:
    """Pad per-sequence anchors to one n (rounded up to a multiple of `pad_blocks_to`: a compiled
    drafter sees few distinct shapes) and lay out blocks, labels and weights [b, n*B]. Labels come
    from `label_ids` when given (the target's argmax), else from `input_ids`; anchors are always
    the data's tokens."""
    b = input_ids.shape[0]
    n = -(-max(1, max(len(a) for a in anchors)) // pad_blocks_to) * pad_blocks_to
    padded = torch.full((b, n), -1, dtype=torch.long)
    for row, a in enumerate(anchors):
        padded[row, : len(a)] = a
    safe = padded.clamp_min(0)
    ids = block_input_ids(input_ids.gather(1, safe), block_size, mask_token_id)
    positions = safe[..., None] + torch.arange(block_size)
    labels, weights = block_labels(input_ids if label_ids is None else label_ids, loss_mask, padded, block_size, gamma)
    return BlockBatch(
        anchors=padded,
        block_ids=ids.view(b, n * block_size),
        block_positions=positions.view(b, n * block_size),
        labels=labels.view(b, n * block_size),
        weights=weights.view(b, n * block_size),
    )
