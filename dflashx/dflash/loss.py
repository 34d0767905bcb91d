"""Labels, slot weights and the chunked LM-head loss of DFlash training.

- Labels are same-position: in the block of anchor a, slot k predicts input_ids[a + k]
  (the drafter's output at slot k is read as the token at position a + k; no shift).
  Slot 0 (the anchor itself) has no loss.
- Slot weight: exp(-(k - 1) / gamma) times the label's loss mask (0 past the sequence end),
  normalised by the sum of weights (DFlash paper: early slots matter most for acceptance).
- The loss never materialises [tokens, V] logits at once: the frozen LM head runs over chunks of
  the supervised tokens, and the gradient for the drafter's output is computed in the same pass
  (fused linear + cross-entropy, as liger-kernel does it), so each chunk's logits are computed
  once and freed; `kernel="liger"` runs liger-kernel's Triton version of it on CUDA.

Public API: `slot_weights(block_size, gamma)`, `block_labels(...)`, `fused_cross_entropy(...)`,
`liger_cross_entropy(...)`, `liger_available()`, `LossOutput`,
`dflash_loss(hidden, lm_head_weight, labels, weights, block_size, chunk_tokens, kernel)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


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


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Weighted cross-entropy of hidden [N, H] @ weight[V, H]^T, chunk by chunk. The LM head is frozen,
    so the gradient for `hidden` is computed right there in the forward pass (softmax minus one-hot,
    times the token's weight, times the head): each chunk's logits are computed once, in fp32, and
    freed before the next chunk; backward only scales that gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, token_weights, chunk):  # noqa: D102 - see the class
        grad = torch.empty_like(hidden) if hidden.requires_grad else None
        ces, preds = [], []
        for start in range(0, hidden.shape[0], chunk):
            sl = slice(start, start + chunk)
            logits = (hidden[sl] @ weight.t()).float()
            lse = torch.logsumexp(logits, dim=-1)
            ces.append(lse - logits.gather(1, labels[sl, None]).squeeze(1))
            preds.append(logits.argmax(-1))
            if grad is not None:
                probs = logits.sub_(lse[:, None]).exp_()
                probs[torch.arange(probs.shape[0], device=probs.device), labels[sl]] -= 1.0
                grad[sl] = probs.mul_(token_weights[sl, None]).to(hidden.dtype) @ weight
        ce, pred = torch.cat(ces), torch.cat(preds)
        ctx.save_for_backward(grad if grad is not None else hidden.new_empty(0))
        ctx.mark_non_differentiable(ce, pred)
        return (ce * token_weights).sum(), ce, pred

    @staticmethod
    def backward(ctx, grad_loss, _grad_ce, _grad_pred):  # noqa: D102 - see the class
        (grad,) = ctx.saved_tensors
        return grad * grad_loss.to(grad.dtype), None, None, None, None


def fused_cross_entropy(
    hidden: torch.Tensor, lm_head_weight: torch.Tensor, labels: torch.Tensor, token_weights: torch.Tensor,
    chunk_tokens: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """sum_i token_weights[i] * CE_i (differentiable in `hidden`), per-token CE [N] and argmax [N] of
    hidden [N, H] @ lm_head_weight[V, H]^T (torch ops, any device; the head gets no gradient)."""
    return _FusedLinearCrossEntropy.apply(hidden, lm_head_weight, labels, token_weights.float(), chunk_tokens)


def liger_cross_entropy(
    hidden: torch.Tensor, lm_head_weight: torch.Tensor, labels: torch.Tensor, token_weights: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same weighted sum and argmax through liger-kernel's fused linear cross-entropy (Triton, CUDA).

    Liger reduces with one weight for all tokens, so tokens are grouped by weight (DFlash weights are
    one value per block slot: about B - 1 groups), each group a `reduction="sum"` call whose input
    gradient liger computes in its forward pass, like `fused_cross_entropy`. Liger sizes its chunks
    so that logits take no more memory than the input (8 tokens a chunk for a 150K vocabulary at
    hidden 5120: measured 2.5x slower steps on an H200); `chunk_mem_const` lets a group be one chunk."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    whole_group = -(-lm_head_weight.shape[0] // lm_head_weight.shape[1])  # logits of a group in one chunk
    loss = hidden.new_zeros((), dtype=torch.float32)
    pred = torch.empty_like(labels)
    for value in torch.unique(token_weights).tolist():
        rows = torch.nonzero(token_weights == value).squeeze(1)
        out = liger_fused_linear_cross_entropy(hidden[rows], lm_head_weight, labels[rows], reduction="sum",
                                               return_predicted_tokens=True, chunk_mem_const=whole_group)
        loss = loss + value * out.loss.float()
        pred[rows] = out.predicted_tokens.to(pred.dtype)
    return loss, pred


def liger_available() -> bool:
    """liger-kernel is importable and there is a CUDA device for its Triton kernels."""
    import importlib.util

    return torch.cuda.is_available() and importlib.util.find_spec("liger_kernel") is not None


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
    kernel: str = "torch",
) -> LossOutput:
    """Weighted CE over supervised slots of hidden [b, n*B, H]; only those rows hit the LM head,
    through `liger_cross_entropy` (kernel "liger") or `fused_cross_entropy` (kernel "torch")."""
    flat_w = weights.flatten()
    keep = flat_w > 0
    slots = torch.arange(weights.shape[-1], device=weights.device).expand_as(weights).flatten()[keep] % block_size
    w = flat_w[keep]
    token_weights = w / w.sum().clamp_min(1e-8)
    rows, kept_labels = hidden.flatten(0, 1)[keep], labels.flatten()[keep]
    if kernel == "liger":
        loss, pred = liger_cross_entropy(rows, lm_head_weight, kept_labels, token_weights)
    else:
        loss, _, pred = fused_cross_entropy(rows, lm_head_weight, kept_labels, token_weights, chunk_tokens)
    correct = torch.zeros(block_size, device=hidden.device).index_add_(0, slots, (pred == kept_labels).float())
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
