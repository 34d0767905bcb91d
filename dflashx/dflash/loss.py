"""Labels, slot weights and the chunked LM-head loss of DFlash training.

- Labels are same-position: in the block of anchor a, slot k predicts input_ids[a + k]
  (the drafter's output at slot k is read as the token at position a + k; no shift).
  Slot 0 (the anchor itself) has no loss.
- Slot weight: exp(-(k - 1) / gamma) times the label's loss mask (0 past the sequence end),
  normalised by the sum of weights (DFlash paper: early slots matter most for acceptance).
- The loss never materialises [tokens, V] logits at once: the LM head runs over chunks of
  tokens under activation checkpointing, so only one chunk's logits live at a time, in forward
  and in backward.

Public API: `slot_weights(block_size, gamma)`, `block_labels(...)`, `chunked_cross_entropy(...)`,
`LossOutput`, `dflash_loss(hidden, lm_head_weight, labels, weights, block_size, chunk_tokens)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def slot_weights(block_size: int, gamma: float) -> torch.Tensor:
    """[B] weights: 0 for slot 0, exp(-(k-1)/gamma) for slot k >= 1."""
    k = torch.arange(block_size, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w


def block_labels(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor, block_size: int, gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels and weights [b, n, B] for anchors [b, n] (-1 = padding; such blocks weigh 0)."""
    length = input_ids.shape[1]
    pos = anchors[..., None] + torch.arange(block_size, device=anchors.device)
    inside = (anchors[..., None] >= 0) & (pos < length)
    safe = pos.clamp(0, length - 1).flatten(1)
    labels = input_ids.gather(1, safe).view_as(pos)
    label_mask = loss_mask.gather(1, safe).view_as(pos).float() * inside
    weights = slot_weights(block_size, gamma).to(label_mask.device) * label_mask
    return labels, weights


def _chunk_ce(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = (hidden @ weight.t()).float()
    return F.cross_entropy(logits, labels, reduction="none"), logits.argmax(-1)


def chunked_cross_entropy(
    hidden: torch.Tensor, lm_head_weight: torch.Tensor, labels: torch.Tensor, chunk_tokens: int = 4096
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token CE [N] and argmax [N] of hidden [N, H] @ lm_head_weight[V, H]^T, chunk by chunk."""
    ces, preds = [], []
    for start in range(0, max(hidden.shape[0], 1), chunk_tokens):
        sl = slice(start, start + chunk_tokens)
        if hidden.requires_grad:
            ce, pred = checkpoint(_chunk_ce, hidden[sl], lm_head_weight, labels[sl], use_reentrant=False)
        else:
            ce, pred = _chunk_ce(hidden[sl], lm_head_weight, labels[sl])
        ces.append(ce)
        preds.append(pred)
    return torch.cat(ces), torch.cat(preds)


@dataclass
class LossOutput:
    """`loss` (scalar, differentiable); per-slot correct counts and label counts [B] (summed)."""

    loss: torch.Tensor
    correct: torch.Tensor
    count: torch.Tensor


def dflash_loss(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    block_size: int,
    chunk_tokens: int = 4096,
) -> LossOutput:
    """Weighted CE over supervised slots of hidden [b, n*B, H]; only those rows hit the LM head."""
    flat_w = weights.flatten()
    keep = flat_w > 0
    slots = torch.arange(weights.shape[-1], device=weights.device).expand_as(weights).flatten()[keep] % block_size
    ce, pred = chunked_cross_entropy(
        hidden.flatten(0, 1)[keep], lm_head_weight, labels.flatten()[keep], chunk_tokens
    )
    w = flat_w[keep]
    loss = (ce * w).sum() / w.sum().clamp_min(1e-8)
    correct = torch.zeros(block_size, device=hidden.device).index_add_(0, slots, (pred == labels.flatten()[keep]).float())
    count = torch.zeros(block_size, device=hidden.device).index_add_(0, slots, torch.ones_like(w))
    return LossOutput(loss=loss, correct=correct, count=count)


def accuracy_per_position(correct: torch.Tensor, count: torch.Tensor) -> list[float]:
    """Accuracy of slots 1..B-1 (NaN-free: a slot never supervised reads 0)."""
    acc = correct[1:] / count[1:].clamp_min(1)
    return [float(a) for a in acc]


def expected_acceptance_length(acc: list[float]) -> float:
    """tau = 1 + sum_k prod_{j<=k} acc_j: expected accepted drafts plus the bonus token,
    treating slot k as accepted when it and all earlier slots are right."""
    total, run = 1.0, 1.0
    for a in acc:
        run *= a
        total += run
    return total if math.isfinite(total) else 1.0
