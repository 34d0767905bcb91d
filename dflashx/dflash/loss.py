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

- The objective (`stages.train.loss`): `decay_ce` weighs slots by that fixed decay; `dpace` by
  D-PACE's weights, computed from the same pass's per-token CE (`dpace_weights`).

Public API: `slot_weights(block_size, gamma)`, `block_labels(...)`, `fused_cross_entropy(...)`,
`fused_cross_entropy_top_k(...)`, `dpace_weights(ce, mask, alpha)`, `head_argmax(...)`, `head_top_k(...)`,
`target_label_ids(...)`, `liger_cross_entropy(...)`, `liger_available()`, `LossOutput`, `SupervisedRows`,
`dflash_loss(hidden, lm_head_weight, labels, weights, block_size, chunk_tokens, kernel, objective,
dpace_alpha, top_k)`.
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
    """Per-token cross-entropy of hidden [N, H] @ weight[V, H]^T, chunk by chunk. The LM head is
    frozen, so each token's input gradient (softmax minus one-hot, times the head) is computed right
    there in the forward pass: each chunk's logits are computed once, in fp32, and freed before the
    next chunk. Backward scales each token's gradient by the upstream gradient of its CE, so any
    (detached) per-token weighting applied afterwards — a fixed slot decay or D-PACE's weights that
    depend on these very CE values — costs nothing more."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk, top_k=0):  # see the class
        grad = torch.empty_like(hidden) if hidden.requires_grad else None
        ces, preds, tops = [], [], [hidden.new_empty((0, top_k), dtype=torch.long)]
        for start in range(0, hidden.shape[0], chunk):
            sl = slice(start, start + chunk)
            logits = (hidden[sl] @ weight.t()).float()
            lse = torch.logsumexp(logits, dim=-1)
            ces.append(lse - logits.gather(1, labels[sl, None]).squeeze(1))
            preds.append(logits.argmax(-1))
            if top_k:
                tops.append(torch.topk(logits, top_k, dim=-1).indices)
            if grad is not None:
                probs = logits.sub_(lse[:, None]).exp_()
                probs[torch.arange(probs.shape[0], device=probs.device), labels[sl]] -= 1.0
                grad[sl] = probs.to(hidden.dtype) @ weight
        ce, pred, top = torch.cat(ces), torch.cat(preds), torch.cat(tops)
        ctx.save_for_backward(grad if grad is not None else hidden.new_empty(0))
        ctx.mark_non_differentiable(pred, top)
        return ce, pred, top

    @staticmethod
    def backward(ctx, grad_ce, _grad_pred, _grad_top):  # see the class
        (grad,) = ctx.saved_tensors
        return grad * grad_ce.to(grad.dtype)[:, None], None, None, None, None


def fused_cross_entropy(
    hidden: torch.Tensor, lm_head_weight: torch.Tensor, labels: torch.Tensor, chunk_tokens: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token CE [N] (differentiable in `hidden`) and argmax [N] of hidden [N, H] @ lm_head_weight[V, H]^T
    (torch ops, any device; the head gets no gradient). Weight and sum the CE to get a loss."""
    ce, pred, _ = _FusedLinearCrossEntropy.apply(hidden, lm_head_weight, labels, chunk_tokens, 0)
    return ce, pred


def fused_cross_entropy_top_k(
    hidden: torch.Tensor, lm_head_weight: torch.Tensor, labels: torch.Tensor, top_k: int, chunk_tokens: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`fused_cross_entropy` and, from the same chunks of logits, each token's top-k ids [N, k] (no
    gradient; DFlash2's selector candidates)."""
    return _FusedLinearCrossEntropy.apply(hidden, lm_head_weight, labels, chunk_tokens, top_k)


def dpace_weights(ce: torch.Tensor, mask: torch.Tensor, alpha: float) -> torch.Tensor:
    """D-PACE position weights [blocks, B] from each slot's CE [blocks, B] (no gradient).

    D-PACE (Dynamic Position-Aware Cross-Entropy, arXiv 2605.18810) as SpecForge (PR #578,
    `OnlineDFlashModel._dpace_weight`, sgl-project/SpecForge@7757409) and speculators
    (`losses.utils.dpace_loss_decay`, vllm-project/speculators@c05b95b) implement it: the drafter's
    confidence in the label q = exp(-CE), smoothed q~ = (1 - alpha) q + alpha; a slot without loss is
    a no-op in the prefix products; slot k weighs sum_{m >= k} prod_{i <= m} q~_i (the expected
    accepted length a correct slot k leads on to), 0 where it has no loss."""
    with torch.no_grad():
        smooth = torch.where(mask, (1.0 - alpha) * torch.exp(-ce.float()) + alpha,
                             torch.ones_like(ce, dtype=torch.float32))
        prefix = torch.cumprod(smooth, dim=-1) * mask
        return torch.flip(torch.cumsum(torch.flip(prefix, dims=[-1]), dim=-1), dims=[-1]) * mask


@torch.no_grad()
def head_argmax(hidden: torch.Tensor, lm_head_weight: torch.Tensor, chunk_tokens: int = 4096) -> torch.Tensor:
    """argmax of hidden [N, H] @ lm_head_weight[V, H]^T, chunk by chunk (the target's greedy token)."""
    out = [(hidden[s:s + chunk_tokens] @ lm_head_weight.t()).argmax(-1)
           for s in range(0, hidden.shape[0], chunk_tokens)]
    return torch.cat(out) if out else torch.empty(0, dtype=torch.long, device=hidden.device)


@torch.no_grad()
def head_top_k(hidden: torch.Tensor, lm_head_weight: torch.Tensor, top_k: int,
               chunk_tokens: int = 4096) -> torch.Tensor:
    """The top-k ids [N, k] of hidden [N, H] @ lm_head_weight[V, H]^T (fp32 logits), chunk by chunk."""
    out = [torch.topk((hidden[s:s + chunk_tokens] @ lm_head_weight.t()).float(), top_k, dim=-1).indices
           for s in range(0, hidden.shape[0], chunk_tokens)]
    return torch.cat(out) if out else torch.empty((0, top_k), dtype=torch.long, device=hidden.device)


def target_label_ids(input_ids: torch.Tensor, loss_mask: torch.Tensor, final_hidden: torch.Tensor,
                     lm_head_weight: torch.Tensor, chunk_tokens: int = 4096) -> torch.Tensor:
    """input_ids [b, L] with every supervised position p >= 1 replaced by the target's argmax after
    position p - 1 (the token greedy verification accepts there); the head runs on those positions only."""
    need = loss_mask[:, 1:].bool()
    labels = input_ids.clone()
    labels[:, 1:][need] = head_argmax(final_hidden[:, :-1][need].to(lm_head_weight.dtype), lm_head_weight,
                                      chunk_tokens).to(labels.dtype)
    return labels


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
class SupervisedRows:
    """The rows of one pass that carry loss (flattened [b*n*B] order): `keep` [b*n*B] bool, `rows` [N, H]
    (the drafter's hidden states, in the graph), `slots` [N], the backbone's normalised weights [N]
    (detached) and the top-k ids [N, k] of their logits (DFlash2's selector candidates)."""

    keep: torch.Tensor
    rows: torch.Tensor
    slots: torch.Tensor
    weights: torch.Tensor
    top_k: torch.Tensor


@dataclass
class LossOutput:
    """`loss` (scalar, differentiable); per-slot correct counts and label counts [B] (summed); with
    `top_k` > 0 the supervised rows the selector loss reads (`SupervisedRows`)."""

    loss: torch.Tensor
    correct: torch.Tensor
    count: torch.Tensor
    supervised: SupervisedRows | None = None


def dflash_loss(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    block_size: int,
    chunk_tokens: int = 4096,
    kernel: str = "torch",
    objective: str = "decay_ce",
    dpace_alpha: float = 0.5,
    top_k: int = 0,
) -> LossOutput:
    """The weighted CE of the supervised slots of hidden [b, n*B, H]; only those rows hit the LM head.

    `objective` "decay_ce": each slot weighs `weights` (the fixed slot decay times the label mask);
    "dpace": a supervised slot weighs `dpace_weights` of this pass's own CE (`weights` > 0 only says
    which slots carry loss). Either way the weights are normalised to sum to 1 over the micro batch,
    so the loss is a weighted mean CE: AdamW and Muon are invariant to a constant scale of the loss,
    and a common scale keeps gradient clipping and the loss curves comparable between objectives
    (SpecForge divides D-PACE's sum by the batch size, speculators by the supervised-token count).
    Kernel "liger" (decay_ce only: liger reduces with one weight per call) or "torch". `top_k` > 0
    (DFlash2) also returns the supervised rows with their top-k ids: from the fused pass's own chunks
    of logits (torch), or a separate chunked pass without gradient (liger)."""
    flat_w = weights.flatten()
    keep = flat_w > 0
    slots = torch.arange(weights.shape[-1], device=weights.device).expand_as(weights).flatten()[keep] % block_size
    rows, kept_labels = hidden.flatten(0, 1)[keep], labels.flatten()[keep]
    if kernel == "liger":
        if objective != "decay_ce":
            raise ValueError(f"the liger loss kernel weighs slots by a fixed decay only, not {objective!r}")
        w = flat_w[keep]
        loss, pred = liger_cross_entropy(rows, lm_head_weight, kept_labels, w / w.sum().clamp_min(1e-8))
        top = head_top_k(rows.detach(), lm_head_weight, top_k, chunk_tokens) if top_k else None
    else:
        ce, pred, top = fused_cross_entropy_top_k(rows, lm_head_weight, kept_labels, top_k, chunk_tokens)
        if objective == "dpace":
            blocks = torch.zeros_like(flat_w).masked_scatter(keep, ce.detach()).view(-1, block_size)
            w = dpace_weights(blocks, keep.view(-1, block_size), dpace_alpha).flatten()[keep]
        else:
            w = flat_w[keep]
        loss = (ce * (w / w.sum().clamp_min(1e-8))).sum()
    correct = torch.zeros(block_size, device=hidden.device).index_add_(0, slots, (pred == kept_labels).float())
    count = torch.zeros(block_size, device=hidden.device).index_add_(0, slots,
                                                                     torch.ones_like(slots, dtype=torch.float32))
    supervised = None
    if top_k and top is not None:  # either kernel's pass returns `top` when top_k > 0
        supervised = SupervisedRows(keep, rows, slots, (w / w.sum().clamp_min(1e-8)).detach(), top)
    return LossOutput(loss=loss, correct=correct, count=count, supervised=supervised)


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
