"""DFlash2's path-selector loss: a k-way cross-entropy over the top-k of the unary logits.

The selector (`dflash2.PathSelector`) scores candidate b of block row t after predecessor a as
    S_t(a, b) = U_t(b) + <A[a] * P(h_t), B[b]>,
U_t the target LM head's logits of the drafter's final hidden h_t. Training (issue #28; SpecForge,
speculators and NeMo agree; the official objective is unpublished):

- candidates: the top-k of U_t (no gradient through the choice; the torch fused pass returns them,
  `loss.fused_cross_entropy_top_k`, the liger path a separate chunked pass, `loss.head_top_k`);
- the predecessor is teacher-forced: the block's anchor for slot 1, the label of slot k - 1 for slot
  k >= 2 (`teacher_predecessors`); with `labels: target` that is the target's argmax, what greedy
  verification accepted, as the walk's predecessor is at decoding;
- a label outside the top-k: `skip` leaves the row out (NeMo; SpecForge's docs), `swap` puts the
  label in place of the k-th (weakest) candidate (speculators);
- the rows weigh the backbone's weights of the same pass (decay or D-PACE, detached), normalised to
  sum to 1 over the rows that count: a weighted mean k-way CE like the backbone's loss;
- the gradient reaches the selector's three tensors and, through both U and P(h), the drafter's
  hidden states: the CE's gradient through U is the backbone CE's own direction restricted to the
  top-k (raise the label's logit against its rivals), and through P(h) it lets the backbone shape
  h for the pairwise term the walk reads at decoding (detaching h would train P on features the
  backbone never adapts). U at the candidates is `candidate_logits`: the head's rows gathered
  chunk by chunk, forward and backward, so [N, k, H] is never held for the whole batch;
- total = backbone + selector_weight x ramp x selector; the ramp (`selector_ramp`) is linear over
  `selector_warmup_ratio` of the steps, a function of the optimizer step (a resumed run continues it).

Public API: `candidate_logits(hidden, weight, candidates, chunk)`, `teacher_predecessors(labels,
block_ids, block_size)`, `selector_ramp(step, total_steps, warmup_ratio)`, `SelectorOutput`,
`selector_loss(selector, rows, lm_head_weight, candidates, labels, predecessors, row_weights, slots,
block_size, gold_missing, chunk)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from dflashx.resolve.formulas import warmup_steps

if TYPE_CHECKING:  # dflash2.py, DFlash2's torch half, imports this module for its loss term
    from dflashx.dflash.dflash2 import PathSelector


class _CandidateLogits(torch.autograd.Function):
    """hidden [N, H] . weight[candidates] [N, k, H] -> [N, k] fp32, chunk by chunk; the head is frozen
    (no gradient), the input gradient gathers the head's rows again chunk by chunk."""

    @staticmethod
    def forward(ctx, hidden, weight, candidates, chunk):  # see the class
        out = [torch.einsum("nh,nkh->nk", hidden[s:s + chunk], weight[candidates[s:s + chunk]]).float()
               for s in range(0, hidden.shape[0], chunk)]
        ctx.save_for_backward(weight, candidates)
        ctx.chunk, ctx.dtype = chunk, hidden.dtype
        return torch.cat(out) if out else hidden.new_zeros((0, candidates.shape[1]), dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad_out):  # see the class
        weight, candidates = ctx.saved_tensors
        grad = weight.new_empty((candidates.shape[0], weight.shape[1]), dtype=ctx.dtype)
        for s in range(0, candidates.shape[0], ctx.chunk):
            grad[s:s + ctx.chunk] = torch.einsum("nk,nkh->nh", grad_out[s:s + ctx.chunk].to(ctx.dtype),
                                                 weight[candidates[s:s + ctx.chunk]].to(ctx.dtype))
        return grad, None, None, None


def candidate_logits(hidden: torch.Tensor, weight: torch.Tensor, candidates: torch.Tensor,
                     chunk: int = 4096) -> torch.Tensor:
    """The unary logits U [N, k] (fp32) of hidden [N, H] at candidate ids [N, k] of the head weight [V, H];
    differentiable in `hidden` only."""
    return _CandidateLogits.apply(hidden, weight, candidates, chunk)


def teacher_predecessors(labels: torch.Tensor, block_ids: torch.Tensor, block_size: int) -> torch.Tensor:
    """Each block row's teacher-forced predecessor [b, n*B]: the anchor (block_ids of slot 0) for slots 0
    and 1, the label of slot k - 1 for slot k >= 2 (slot 0 carries no loss)."""
    lab = labels.view(*labels.shape[:-1], -1, block_size)
    anchor = block_ids.view_as(lab)[..., :1]
    return torch.cat([anchor, anchor, lab[..., 1:-1]], dim=-1).reshape(labels.shape)


def selector_ramp(step: int, total_steps: int, warmup_ratio: float) -> float:
    """The selector loss's weight factor at optimizer step `step` (0-based): linear to 1 over
    ceil(ratio x total) steps, as the learning-rate warm-up (1 from the first step when the ratio is 0)."""
    return min(1.0, (step + 1) / warmup_steps(total_steps, warmup_ratio))


@dataclass
class SelectorOutput:
    """`loss` (scalar, differentiable: the weighted mean k-way CE); per-slot sums [B] over the supervised
    rows: `correct` (the selector's top-1 is the label), `hit` (the label is among the top-k)."""

    loss: torch.Tensor
    correct: torch.Tensor
    hit: torch.Tensor


def _ce_scores(scores: torch.Tensor, hit: torch.Tensor, where: torch.Tensor, gold_missing: str,
               weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The k-way logits, targets and row weights of the CE from scores [N, k + 1] (the top-k, then the label)."""
    k = scores.shape[1] - 1
    if gold_missing == "skip":
        return scores[:, :k], where, weights * hit
    if gold_missing != "swap":
        raise ValueError(f"selector_gold_missing must be skip or swap, not {gold_missing!r}")
    last = torch.where(hit, scores[:, k - 1], scores[:, k])  # the label in place of the weakest candidate
    return torch.cat([scores[:, : k - 1], last[:, None]], dim=1), torch.where(hit, where, k - 1), weights


def selector_loss(selector: PathSelector, rows: torch.Tensor, lm_head_weight: torch.Tensor, candidates: torch.Tensor,
                  labels: torch.Tensor, predecessors: torch.Tensor, row_weights: torch.Tensor,
                  slots: torch.Tensor, block_size: int, gold_missing: str = "skip",
                  chunk: int = 4096) -> SelectorOutput:
    """The selector loss of the supervised rows [N, H] (see the module doc): candidates [N, k] (the top-k
    of U), labels, predecessors and slots [N], row_weights [N] (the backbone's, detached)."""
    k = candidates.shape[1]
    columns = torch.cat([candidates, labels[:, None]], dim=1)
    scores = candidate_logits(rows, lm_head_weight, columns, chunk) + \
        selector.pair_scores(rows, predecessors, columns).float()
    match = candidates == labels[:, None]
    hit, where = match.any(1), match.float().argmax(1)
    logits, target, w = _ce_scores(scores, hit, where, gold_missing, row_weights.detach().float())
    ce = F.cross_entropy(logits, target, reduction="none")
    loss = (ce * (w / w.sum().clamp_min(1e-8))).sum()
    with torch.no_grad():
        right = candidates.gather(1, scores[:, :k].argmax(1, keepdim=True)).squeeze(1) == labels
        zeros = torch.zeros(block_size, device=rows.device)
        correct = zeros.index_add(0, slots, right.float())
        hits = zeros.index_add(0, slots, hit.float())
    return SelectorOutput(loss=loss, correct=correct, hit=hits)
