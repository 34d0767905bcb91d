"""DFlash2's selector loss against naive full-logits implementations: candidates, the differentiable
unary term, both gold-missing policies, teacher-forced predecessors, the ramp; the optimizer's
split of the DFlash2 drafter; DFlash's loss untouched by the selector's additions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dflashx.dflash.dflash2 import PathSelector
from dflashx.dflash.loss import dflash_loss, fused_cross_entropy, fused_cross_entropy_top_k, head_top_k
from dflashx.dflash.selector_loss import (
    candidate_logits, selector_loss, selector_ramp, teacher_predecessors,
)

V, H, R, K = 50, 16, 8, 4


def _selector(seed: int = 0) -> PathSelector:
    torch.manual_seed(seed)
    sel = PathSelector(H, V, R, K)
    with torch.no_grad():  # a trained-looking successor codebook (it starts at zero)
        sel.successor_codebook.weight.normal_(std=0.5)
    return sel


def _naive(sel, rows, head, labels, preds, weights, gold_missing):
    """The selector loss from full [N, V] logits, one row at a time where the policies differ."""
    logits = rows @ head.t()
    cand = logits.topk(K, dim=-1).indices
    losses, ws = [], []
    for n in range(rows.shape[0]):
        cols = cand[n].clone()
        hit = bool((cols == labels[n]).any())
        if not hit and gold_missing == "skip":
            continue
        if not hit:
            cols[K - 1] = labels[n]
        score = logits[n, cols] + (sel.predecessor_codebook.weight[preds[n]] * sel.hidden_projection(rows[n])
                                   * sel.successor_codebook.weight[cols]).sum(-1)
        target = int((cols == labels[n]).nonzero()[0])
        losses.append(F.cross_entropy(score[None], torch.tensor([target])))
        ws.append(weights[n])
    w = torch.stack(ws)
    return (torch.stack(losses) * w / w.sum()).sum(), cand


@pytest.mark.parametrize("gold_missing", ["skip", "swap"])
def test_selector_loss_and_gradients_match_full_logits(gold_missing):
    torch.manual_seed(1)
    sel, head = _selector(), torch.randn(V, H)
    rows = torch.randn(13, H, requires_grad=True)
    labels = torch.randint(0, V, (13,))
    with torch.no_grad():  # make half the labels the top-1, so both kinds of rows occur
        labels[::2] = (rows[::2] @ head.t()).argmax(-1)
    preds, weights, slots = torch.randint(0, V, (13,)), torch.rand(13) + 0.1, torch.arange(13) % 4
    ref, cand = _naive(sel, rows, head, labels, preds, weights, gold_missing)
    ref.backward()
    ref_grads = [rows.grad.clone()] + [p.grad.clone() for p in sel.parameters()]
    rows.grad = None
    sel.zero_grad()
    _, _, top = fused_cross_entropy_top_k(rows, head, labels, K, chunk_tokens=5)
    assert torch.equal(top, cand) and torch.equal(head_top_k(rows.detach(), head, K, chunk_tokens=4), cand)
    out = selector_loss(sel, rows, head, top, labels, preds, weights, slots, 4, gold_missing, chunk=3)
    out.loss.backward()
    got = [rows.grad] + [p.grad for p in sel.parameters()]
    assert torch.allclose(out.loss, ref, atol=1e-5)
    for a, b in zip(got, ref_grads):
        assert torch.allclose(a, b, atol=1e-5)
    hit = (cand == labels[:, None]).any(1).float()
    assert out.hit.tolist() == torch.zeros(4).index_add(0, slots, hit).tolist()


def test_skip_drops_the_row_and_swap_puts_the_gold_in_the_last_slot():
    """Row 0's label is outside the top-k: skip gives it no loss (the loss is row 1's alone); swap
    scores it in place of the k-th candidate: with a zero pair term, the CE of the label against the
    top k - 1 logits."""
    torch.manual_seed(2)
    sel, head = PathSelector(H, V, R, K), torch.randn(V, H)  # successor codebook zero: S = U
    rows = torch.randn(2, H)
    logits = rows @ head.t()
    order = logits.argsort(-1, descending=True)
    labels = torch.stack([order[0, -1], order[1, 0]])  # row 0: the lowest logit; row 1: the top-1
    top = logits.topk(K, -1).indices
    preds, weights, slots = torch.zeros(2, dtype=torch.long), torch.ones(2), torch.tensor([1, 2])
    skip = selector_loss(sel, rows, head, top, labels, preds, weights, slots, 4, "skip")
    swap = selector_loss(sel, rows, head, top, labels, preds, weights, slots, 4, "swap")
    ce = [F.cross_entropy(logits[n, top[n]][None], torch.tensor([0])) for n in (0, 1)]
    gold_last = torch.cat([logits[0, top[0, :K - 1]], logits[0, labels[0]].view(1)])
    swapped = F.cross_entropy(gold_last[None], torch.tensor([K - 1]))
    assert skip.loss.item() == pytest.approx(float(ce[1]), abs=1e-6)
    assert swap.loss.item() == pytest.approx(float((swapped + ce[1]) / 2), abs=1e-6)
    assert skip.hit.tolist() == swap.hit.tolist() == [0, 0, 1, 0]
    assert skip.correct.tolist() == swap.correct.tolist() == [0, 0, 1, 0]  # accuracy reads the true top-k
    none = selector_loss(sel, rows[:1], head, top[:1], labels[:1], preds[:1], weights[:1], slots[:1], 4, "skip")
    assert none.loss == 0 and torch.isfinite(none.loss)


def test_candidate_logits_are_the_heads_rows_with_their_gradient():
    torch.manual_seed(3)
    head, rows = torch.randn(V, H), torch.randn(7, H, requires_grad=True)
    cand = torch.randint(0, V, (7, 5))
    g = torch.randn(7, 5)
    (candidate_logits(rows, head, cand, chunk=2) * g).sum().backward()
    grad, rows.grad = rows.grad.clone(), None
    full = (rows @ head.t()).gather(1, cand)
    (full * g).sum().backward()
    assert torch.allclose(candidate_logits(rows, head, cand), full) and torch.allclose(grad, rows.grad, atol=1e-6)


def test_teacher_forced_predecessors_are_the_anchor_then_the_previous_label():
    block_ids = torch.tensor([[7, 1, 1, 1, 9, 1, 1, 1]])  # anchor, MASK x 3 per block
    labels = torch.tensor([[70, 71, 72, 73, 90, 91, 92, 93]])  # `labels: target`: slot 0's label need not be 7
    assert teacher_predecessors(labels, block_ids, 4).tolist() == [[7, 7, 71, 72, 9, 9, 91, 92]]


def test_the_ramp_is_linear_over_the_warmup_share_of_steps():
    assert [selector_ramp(s, 100, 0.04) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert selector_ramp(0, 100, 0.0) == 1.0


def test_dflash_loss_is_unchanged_by_the_top_k_option():
    """DFlash (top_k 0) computes exactly what the fused CE summed with normalised weights gives, and
    asking for candidates changes neither the loss nor its gradient."""
    torch.manual_seed(4)
    head, labels = torch.randn(V, H), torch.randint(0, V, (1, 8))
    weights = torch.tensor([[0.0, 1.0, 0.5, 0.0, 0.0, 1.0, 0.5, 0.25]])
    grads, losses = [], []
    for top_k in (0, K):
        hidden = torch.randn(1, 8, H, generator=torch.Generator().manual_seed(5)).requires_grad_()
        out = dflash_loss(hidden, head, labels, weights, block_size=4, chunk_tokens=3, top_k=top_k)
        out.loss.backward()
        losses.append(out.loss.detach())
        grads.append(hidden.grad)
        assert (out.supervised is None) == (top_k == 0)
    keep = weights.flatten() > 0
    ce, _ = fused_cross_entropy(hidden.detach()[0][keep], head, labels[0][keep], chunk_tokens=3)
    w = weights.flatten()[keep]
    assert torch.equal(losses[0], (ce * (w / w.sum().clamp_min(1e-8))).sum())
    assert torch.equal(losses[0], losses[1]) and torch.equal(grads[0], grads[1])


def test_the_liger_path_gives_the_selector_the_same_rows(monkeypatch):
    """Liger (CUDA only) is stood in for by the torch fused CE: its separate top-k pass and the rows,
    slots and normalised weights it hands the selector equal the torch path's."""
    import dflashx.dflash.loss as loss_module

    def torch_liger(rows, head, labels, weights):
        ce, pred = fused_cross_entropy(rows, head, labels)
        return (ce * weights).sum(), pred

    monkeypatch.setattr(loss_module, "liger_cross_entropy", torch_liger)
    torch.manual_seed(6)
    head, labels, hidden = torch.randn(V, H), torch.randint(0, V, (2, 8)), torch.randn(2, 8, H)
    weights = torch.tensor([[0.0, 1.0, 0.5, 0.25] * 2, [0.0, 1.0, 0.0, 0.0] * 2])
    outs = [dflash_loss(hidden, head, labels, weights, 4, chunk_tokens=3, kernel=kernel, top_k=K)
            for kernel in ("torch", "liger")]
    a, b = (o.supervised for o in outs)
    assert torch.allclose(outs[0].loss, outs[1].loss) and torch.equal(a.top_k, b.top_k)
    assert torch.equal(a.keep, b.keep) and torch.equal(a.slots, b.slots) and torch.equal(a.weights, b.weights)
    assert torch.equal(a.rows, b.rows) and a.weights.sum() == pytest.approx(1.0)
