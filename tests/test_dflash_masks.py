"""The block mask: each rule checked on our mask and shown to catch the known buggy variants
(`<=` context visibility, a causal block, masks per position instead of per anchor), the
sliding-window variant, flex attention == SDPA, and leak tests through the drafter itself."""

from __future__ import annotations

import pytest
import torch

from dflashx.dflash.config import DFlashConfig
from dflashx.dflash.masks import DraftMask, dense_mask, make_mask_mod
from dflashx.dflash.model import DFlashDrafter

B, T = 4, 12
ANCHORS = torch.tensor([[3, 5, 9], [0, 2, -1]])  # overlapping blocks; a padded anchor in row 1


def _grid(mod):
    return dense_mask(mod, ANCHORS.shape[0], ANCHORS.shape[1] * B, T + ANCHORS.shape[1] * B, torch.device("cpu"))[:, 0]


def ours(causal=False, window=None):
    return make_mask_mod(ANCHORS, T, B, causal, window)


def buggy_le_context():
    good = ours()
    return lambda b, h, q, kv: good(b, h, q, kv) | ((kv < T) & (kv == ANCHORS[b, q // B]))


def buggy_per_position():
    """Block keys visible by position range [anchor, anchor + B) instead of by block index."""
    good = ours()

    def mod(b, h, q, kv):
        a = ANCHORS[b, q // B]
        rel = kv - T
        key_pos = ANCHORS[b, (rel // B).clamp(0, ANCHORS.shape[1] - 1)] + rel % B
        return torch.where(kv < T, good(b, h, q, kv), (key_pos >= a) & (key_pos < a + B) & (rel >= 0))

    return mod


def check_context_strict(mask):
    for b in range(ANCHORS.shape[0]):
        for i, a in enumerate(ANCHORS[b].tolist()):
            for s in range(B):
                expected = torch.arange(T) < a
                assert torch.equal(mask[b, i * B + s, :T], expected), (b, i, s)


def check_own_block_bidirectional(mask):
    for b in range(ANCHORS.shape[0]):
        for i in range(ANCHORS.shape[1]):
            rows = slice(i * B, (i + 1) * B)
            cols = slice(T + i * B, T + (i + 1) * B)
            assert mask[b, rows, cols].all(), (b, i)


def check_no_other_block(mask):
    n = ANCHORS.shape[1]
    for i in range(n):
        for j in range(n):
            if i != j:
                assert not mask[:, i * B:(i + 1) * B, T + j * B:T + (j + 1) * B].any(), (i, j)


def test_our_mask_obeys_every_rule():
    mask = _grid(ours())
    check_context_strict(mask)
    check_own_block_bidirectional(mask)
    check_no_other_block(mask)
    assert mask.any(-1).all(), "no query row may be empty (padded anchors see their own block)"


@pytest.mark.parametrize(
    ("bug", "check"),
    [
        (buggy_le_context, check_context_strict),
        (lambda: ours(causal=True), check_own_block_bidirectional),
        (buggy_per_position, check_no_other_block),
    ],
    ids=["le-instead-of-lt", "causal-block", "per-position-not-per-anchor"],
)
def test_each_rule_catches_its_bug(bug, check):
    with pytest.raises(AssertionError):
        check(_grid(bug()))


def test_causal_layer_keeps_lower_triangle_in_block():
    mask = _grid(ours(causal=True))
    block = mask[0, 0:B, T:T + B]
    assert torch.equal(block, torch.tril(torch.ones(B, B, dtype=torch.bool)))
    check_context_strict(mask)


def test_sliding_window_limits_context_by_query_position():
    window = 4
    mask = _grid(ours(window=window))
    for i, a in enumerate(ANCHORS[0].tolist()):
        for s in range(B):
            qpos = a + s
            expected = (torch.arange(T) < a) & (qpos - torch.arange(T) < window)
            assert torch.equal(mask[0, i * B + s, :T], expected)
    assert mask[0, 0:B, T:T + B].all()  # the block (B <= window) stays fully visible


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_matches_sdpa():
    from dflashx.dflash.masks import attend

    torch.manual_seed(0)
    q = torch.randn(2, 4, ANCHORS.shape[1] * B, 8)
    k = torch.randn(2, 2, T + ANCHORS.shape[1] * B, 8)
    v = torch.randn_like(k)
    for causal, window in [(False, None), (True, 5)]:
        sdpa = attend(q, k, v, DraftMask(ANCHORS, T, B, backend="sdpa").for_layer(causal, window), 0.3)
        flex = attend(q, k, v, DraftMask(ANCHORS, T, B, backend="flex").for_layer(causal, window), 0.3)
        assert torch.allclose(sdpa, flex, atol=1e-5)


def _drafter(layers=2):
    cfg = DFlashConfig(num_layers=layers, block_size=B, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, intermediate_size=48, vocab_size=50, target_layer_ids=[0, 1], num_target_layers=4,
                       mask_token_id=1, layer_types=["full_attention"] * layers, causal_layers=[False] * layers)
    torch.manual_seed(0)
    return DFlashDrafter(cfg).eval()


def _run(d, feats, embeds, anchors):
    positions = (anchors.clamp_min(0)[..., None] + torch.arange(B)).flatten(1)
    mask = DraftMask(anchors, feats.shape[1], B)
    return d(embeds, d.fuse(feats), positions, torch.arange(feats.shape[1])[None], mask)


def test_drafter_never_sees_the_anchor_features_or_later():
    d, anchors = _drafter(), torch.tensor([[3, 5, 9]])
    feats, embeds = torch.randn(1, T, 64), torch.randn(1, 3 * B, 32)
    base = _run(d, feats, embeds, anchors)
    changed = feats.clone()
    changed[:, 5:] += 1.0  # features at and after anchor 5
    out = _run(d, changed, embeds, anchors)
    assert torch.allclose(out[:, :2 * B], base[:, :2 * B], atol=1e-6)  # blocks at 3 and 5 untouched
    assert not torch.allclose(out[:, 2 * B:], base[:, 2 * B:])  # the block at 9 sees positions 5..8


def test_blocks_are_isolated_and_bidirectional():
    d, anchors = _drafter(), torch.tensor([[3, 5, 9]])
    feats, embeds = torch.randn(1, T, 64), torch.randn(1, 3 * B, 32)
    base = _run(d, feats, embeds, anchors)
    changed = embeds.clone()
    changed[:, B + B - 1] += 1.0  # last slot of the block anchored at 5 (overlaps block 3's positions)
    out = _run(d, feats, changed, anchors)
    assert torch.allclose(out[:, :B], base[:, :B], atol=1e-6)
    assert torch.allclose(out[:, 2 * B:], base[:, 2 * B:], atol=1e-6)
    assert not torch.allclose(out[:, B + 1], base[:, B + 1])  # slot 1 of that block sees slot B-1
