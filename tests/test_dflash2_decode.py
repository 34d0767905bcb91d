"""DFlash2 without the reference: the convolution never reaches across a block (on its own and
through the whole training forward, several blocks in one row under the per-anchor mask), and the
untrained DFlash2 drafter (identity convolutions, zero successor codebook) drafts exactly what the
DFlash backbone with the same weights drafts."""

from __future__ import annotations

import torch
from helpers_dflash2 import perturb_dflash2
from test_spec_decode import PROMPT, build_target

from dflashx.dflash.dflash2 import GroupedDynamicConv
from dflashx.dflash.masks import DraftMask
from dflashx.dflash.model import DFlashDrafter, block_input_ids
from dflashx.dflash.proposal import propose
from dflashx.dflash.spec_decode import SpecDecoder
from helpers_dflash import config_for

B, H = 4, 64


def _conv() -> GroupedDynamicConv:
    conv = GroupedDynamicConv(H, kernel_size=3, group_size=16)
    torch.manual_seed(0)
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    return conv


def _both_sides(conv: GroupedDynamicConv, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y, dynamic = conv.prepare(x, B)
    return y, conv.finish(torch.tanh(y), dynamic, B)


def test_the_convolution_never_reaches_across_a_block_and_never_ahead():
    conv, x = _conv(), torch.randn(1, 3 * B, H)
    changed = x.clone()
    changed[0, B - 1] += 1.0  # the last row of block 0
    for before, after in zip(_both_sides(conv, x), _both_sides(conv, changed)):
        assert not torch.allclose(before[0, B - 1], after[0, B - 1])
        assert torch.equal(before[0, B:], after[0, B:])  # blocks 1 and 2 untouched
    changed = x.clone()
    changed[0, B + 1] += 1.0  # row 1 of block 1 reaches rows 1 and 2 of it (kernel 3), nothing before
    for before, after in zip(_both_sides(conv, x), _both_sides(conv, changed)):
        assert torch.equal(before[0, : B + 1], after[0, : B + 1])
        assert not torch.allclose(before[0, B + 1 : B + 3], after[0, B + 1 : B + 3])
        assert torch.equal(before[0, 2 * B :], after[0, 2 * B :])


def _drafter(target, architecture: str, seed: int = 1) -> DFlashDrafter:
    cfg = config_for(target.config, num_layers=2, block_size=B, num_target_layers=2,
                     mask_token_id=target.config.vocab_size - 1, architecture=architecture,
                     selector_rank=16, selector_top_k=4)
    torch.manual_seed(seed)
    return DFlashDrafter(cfg).eval()


def test_a_token_of_the_previous_block_changes_nothing_in_the_next_through_the_training_forward():
    target = build_target("qwen3")
    drafter = perturb_dflash2(_drafter(target, "dflash2"), conv=0.5, successor=1.0)
    identity = _drafter(target, "dflash2")  # same backbone, identity convolutions
    embed, t = target.get_input_embeddings(), 12
    anchors = torch.tensor([[5, 9]])  # blocks at positions 5..8 and 9..12, one row, as training lays them out
    ids = block_input_ids(torch.tensor([[17, 23]]), B, drafter.config.mask_token_id).view(1, -1)
    changed = ids.clone()
    changed[0, 0], changed[0, 2] = 31, 40  # block 0's anchor and one of its mask slots
    positions = (anchors[..., None] + torch.arange(B)).view(1, -1)
    context = torch.randn(1, t, 2 * H, generator=torch.Generator().manual_seed(2))

    def forward(model: DFlashDrafter, rows: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(embed(rows), model.fuse(context), positions, torch.arange(t)[None],
                         DraftMask(anchors, t, B, backend="sdpa"))

    before, after = forward(drafter, ids), forward(drafter, changed)
    assert not torch.allclose(before[0, :B], after[0, :B])
    assert torch.allclose(before[0, B:], after[0, B:], atol=1e-6)
    assert not torch.allclose(before, forward(identity, ids), atol=1e-3)  # the convolutions act


def test_untrained_dflash2_drafts_what_the_dflash_backbone_drafts():
    target = build_target("qwen3")
    dflash2 = _drafter(target, "dflash2")
    dflash = _drafter(target, "dflash")
    backbone = {k: v for k, v in dflash2.state_dict().items() if k in dflash.state_dict()}
    assert backbone.keys() == dflash.state_dict().keys()
    dflash.load_state_dict(backbone)
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    g = torch.Generator().manual_seed(3)
    for length in (4, 9, 15):
        feats = torch.randn(1, length, 2 * H, generator=g)
        anchor = int(torch.randint(0, 90, (1,), generator=g))
        drafts = [propose(d, d.extend_context(None, feats), anchor, B - 1, embed, head)[0]
                  for d in (dflash, dflash2)]
        assert torch.equal(*drafts)
    runs = [SpecDecoder(target, d).generate(PROMPT, 20) for d in (dflash, dflash2)]
    assert runs[0].output_ids == runs[1].output_ids and runs[0].accepted == runs[1].accepted
