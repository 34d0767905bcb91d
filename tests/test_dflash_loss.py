"""Anchors, same-position labels, slot weights, the chunked LM-head loss and the acceptance metric."""

from __future__ import annotations

import math

import pytest
import torch

from dflashx.dflash.anchors import build_block_batch, sample_anchors, valid_anchor_positions
from dflashx.dflash.loss import (
    block_labels, dflash_loss, dpace_weights, expected_acceptance_length, fused_cross_entropy, slot_weights,
    target_label_ids,
)

MASK_ID = 1


def test_anchors_only_where_anchor_and_next_token_carry_loss():
    loss_mask = torch.tensor([0, 0, 1, 1, 1, 0, 1, 1, 0, 1])
    assert valid_anchor_positions(loss_mask).tolist() == [2, 3, 6]


def test_anchor_draw_is_without_replacement_capped_and_reproducible():
    loss_mask = torch.ones(200, dtype=torch.long)
    a = sample_anchors(loss_mask, 50, seed=0, epoch=0, index=3)
    assert len(a) == 50 and len(set(a.tolist())) == 50 and torch.equal(a, a.sort().values)
    assert torch.equal(a, sample_anchors(loss_mask, 50, seed=0, epoch=0, index=3))
    assert not torch.equal(a, sample_anchors(loss_mask, 50, seed=0, epoch=1, index=3))  # resampled per epoch
    assert not torch.equal(a, sample_anchors(loss_mask, 50, seed=0, epoch=0, index=4))
    short = torch.tensor([0, 1, 1, 1])
    assert sample_anchors(short, 50, 0, 0, 0).tolist() == [1, 2]  # fewer for short sequences


def test_labels_are_same_position_not_shifted():
    ids = torch.arange(100, 120)[None]
    labels, _ = block_labels(ids, torch.ones_like(ids), torch.tensor([[5, 11]]), 4, 7.0)
    assert labels[0, 0].tolist() == [105, 106, 107, 108]  # slot k -> input_ids[anchor + k]
    assert labels[0, 1].tolist() == [111, 112, 113, 114]


def test_slot_weights_decay_and_follow_the_label_mask():
    w = slot_weights(16, 7.0)
    assert w[0] == 0 and w[1] == 1 and math.isclose(float(w[8]), math.exp(-1.0), rel_tol=1e-6)
    ids = torch.arange(10)[None]
    loss_mask = torch.tensor([[0, 1, 1, 1, 0, 1, 1, 1, 1, 1]])
    _, weights = block_labels(ids, loss_mask, torch.tensor([[2, 8, -1]]), 4, 4.0)
    decay = [0.0, 1.0, math.exp(-0.25), math.exp(-0.5)]
    assert torch.allclose(weights[0, 0], torch.tensor([0.0, decay[1], 0.0, decay[3]]))  # position 4 has no loss
    assert torch.allclose(weights[0, 1], torch.tensor([0.0, decay[1], 0.0, 0.0]))  # past the end
    assert weights[0, 2].sum() == 0  # padded anchor


def test_block_batch_layout():
    ids = torch.arange(30, 50)[None]
    bb = build_block_batch(ids, torch.ones_like(ids), [torch.tensor([4, 6])], 3, MASK_ID, 4.0)
    assert bb.block_ids[0].tolist() == [34, MASK_ID, MASK_ID, 36, MASK_ID, MASK_ID]
    assert bb.block_positions[0].tolist() == [4, 5, 6, 6, 7, 8]
    assert bb.labels[0].tolist() == [34, 35, 36, 36, 37, 38]


@pytest.mark.parametrize("chunk", [8, 37, 4096])
def test_fused_cross_entropy_equals_full_logits_values_and_grads(chunk):
    """The per-token gradient computed in the forward pass is autograd's through full logits, scaled by
    whatever weights the CE is summed with afterwards (and by DeepSpeed's 1/accumulation); fp32, 1e-5."""
    torch.manual_seed(0)
    hidden = torch.randn(37, 16, requires_grad=True)
    head = torch.randn(300, 16)
    labels = torch.randint(0, 300, (37,))
    weights = torch.rand(37)
    ce, pred = fused_cross_entropy(hidden, head, labels, chunk_tokens=chunk)
    (0.25 * (ce * weights).sum()).backward()
    grad = hidden.grad.clone()
    hidden.grad = None
    full = torch.nn.functional.cross_entropy(hidden @ head.t(), labels, reduction="none")
    (0.25 * (full * weights).sum()).backward()
    assert torch.allclose(ce, full, atol=1e-5)
    assert torch.allclose(grad, hidden.grad, atol=1e-5)
    assert torch.equal(pred, (hidden @ head.t()).argmax(-1))
    assert not head.requires_grad and head.grad is None


def test_fused_cross_entropy_without_grad_keeps_no_gradient():
    hidden, head = torch.randn(5, 8), torch.randn(30, 8)
    ce, _ = fused_cross_entropy(hidden, head, torch.randint(0, 30, (5,)))
    assert not ce.requires_grad and torch.isfinite(ce).all()


def test_loss_is_weight_normalised_and_counts_per_slot():
    torch.manual_seed(0)
    head = torch.randn(20, 8)
    hidden = torch.randn(1, 8, 8)
    labels = torch.randint(0, 20, (1, 8))
    weights = torch.tensor([[0.0, 1.0, 0.5, 0.0, 0.0, 1.0, 0.5, 0.25]])
    out = dflash_loss(hidden, head, labels, weights, block_size=4, chunk_tokens=3)
    ce = torch.nn.functional.cross_entropy(hidden[0] @ head.t(), labels[0], reduction="none")
    assert torch.allclose(out.loss, (ce * weights[0]).sum() / weights.sum())
    assert out.count.tolist() == [0, 2, 2, 1]
    right = ((hidden[0] @ head.t()).argmax(-1) == labels[0]).float() * (weights[0] > 0)
    assert out.correct.tolist() == [0, float(right[1] + right[5]), float(right[2] + right[6]), float(right[7])]


def _dpace_closed_form(q: list[float], alpha: float) -> list[float]:
    """D-PACE weights written out from the paper's recurrence for one block whose slots all carry loss:
    w_k = sum_{m >= k} prod_{i <= m} ((1 - alpha) q_i + alpha)."""
    smooth = [(1 - alpha) * x + alpha for x in q]
    prefix = [math.prod(smooth[: m + 1]) for m in range(len(q))]
    return [sum(prefix[k:]) for k in range(len(q))]


def test_dpace_weights_follow_the_recurrence_and_skip_slots_without_loss():
    ce = torch.tensor([[0.0, 0.2, 1.0, 0.5], [0.0, 0.3, 0.1, 2.0]])
    mask = torch.tensor([[False, True, True, True], [False, True, False, True]])
    w = dpace_weights(ce, mask, alpha=0.5)
    q = torch.exp(-ce).tolist()
    assert w[0].tolist() == pytest.approx([0.0, *_dpace_closed_form(q[0][1:], 0.5)])
    # a slot without loss is a no-op in the products and weighs 0: slot 3 sees only slot 1's confidence
    s1, s3 = 0.5 * q[1][1] + 0.5, 0.5 * q[1][3] + 0.5
    assert w[1].tolist() == pytest.approx([0.0, s1 + s1 * s3, 0.0, s1 * s3])
    assert not w.requires_grad
    # non-increasing along a block of supervised slots; alpha = 1 gives weights (B-1, B-2, ..., 1)
    assert all(a >= b for a, b in zip(w[0, 1:].tolist(), w[0, 2:].tolist()))
    assert dpace_weights(ce[:1], mask[:1], alpha=1.0)[0].tolist() == pytest.approx([0.0, 3.0, 2.0, 1.0])


def test_dpace_loss_is_the_weighted_mean_ce_with_detached_weights():
    """loss = sum(w CE) / sum(w) with w from the same CE but detached: the gradient is autograd's of
    that expression with w held constant."""
    torch.manual_seed(1)
    head = torch.randn(20, 8)
    hidden = torch.randn(1, 8, 8, requires_grad=True)
    labels = torch.randint(0, 20, (1, 8))
    weights = torch.tensor([[0.0, 1.0, 0.5, 0.0, 0.0, 1.0, 0.5, 0.25]])
    out = dflash_loss(hidden, head, labels, weights, block_size=4, objective="dpace", dpace_alpha=0.5)
    out.loss.backward()
    grad, hidden.grad = hidden.grad.clone(), None
    ce = torch.nn.functional.cross_entropy(hidden[0] @ head.t(), labels[0], reduction="none")
    w = dpace_weights(ce.detach().view(2, 4), (weights[0] > 0).view(2, 4), 0.5).flatten()
    ref = (ce * w).sum() / w.sum()
    ref.backward()
    assert torch.allclose(out.loss, ref, atol=1e-6) and torch.allclose(grad, hidden.grad, atol=1e-6)
    assert out.count.tolist() == [0, 2, 2, 1]
    decayed = dflash_loss(hidden.detach(), head, labels, weights, block_size=4)
    assert not torch.allclose(decayed.loss, out.loss)  # the objective changes the loss


def test_liger_kernel_refuses_dpace():
    with pytest.raises(ValueError, match="fixed decay only"):
        dflash_loss(torch.randn(1, 4, 8), torch.randn(20, 8), torch.zeros(1, 4, dtype=torch.long),
                    torch.tensor([[0.0, 1.0, 1.0, 1.0]]), block_size=4, kernel="liger", objective="dpace")


def test_target_labels_are_the_heads_argmax_one_position_back():
    """Position p >= 1 with loss gets argmax(head(h[p - 1])); other positions keep the data's token."""
    torch.manual_seed(2)
    head, final = torch.randn(50, 8), torch.randn(1, 6, 8)
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    loss_mask = torch.tensor([[0, 0, 1, 1, 0, 1]])
    labels = target_label_ids(ids, loss_mask, final, head, chunk_tokens=2)
    best = (final[0] @ head.t()).argmax(-1)
    assert labels[0].tolist() == [3, 4, int(best[1]), int(best[2]), 7, int(best[4])]
    assert ids[0].tolist() == [3, 4, 5, 6, 7, 8]  # the data is not modified
    bb = build_block_batch(ids, loss_mask, [torch.tensor([2])], 3, MASK_ID, 4.0, label_ids=labels)
    assert bb.block_ids[0].tolist() == [5, MASK_ID, MASK_ID]  # the anchor stays the data's token
    assert bb.labels[0].tolist() == [int(best[1]), int(best[2]), 7]


@pytest.mark.parametrize(("acc", "tau"), [([1.0, 1.0, 1.0], 4.0), ([0.0, 1.0], 1.0), ([0.5, 0.5], 1.75)])
def test_expected_acceptance_length(acc, tau):
    assert expected_acceptance_length(acc) == pytest.approx(tau)
