"""The batched speculative decoder, greedy: every prompt of a batch decodes exactly what `SpecDecoder` decodes
for it alone (output ids, drafted and accepted counts per cycle, target forwards), for DFlash and DFlash2
drafters on dense and MoE targets, with prompts of different lengths, rows ending early at a stop token or
at max_new_tokens, rows accepting different numbers of drafts; the drafter's side of a batch (per-row
contexts, blocks cut short) drafts what one block drafts; hybrid targets fall back to one prompt at a time.

Targets are tiny random models (fp32); nothing is mocked except the oracle test's proposals."""

from __future__ import annotations

import pytest
import torch
from helpers_batch import FAMILIES, drafter, prompts, tilted_target
from test_spec_decode import build_drafter, build_target, greedy_reference

from dflashx.dflash import batch_decode
from dflashx.dflash.batch_decode import BatchDecoder, unbatchable
from dflashx.dflash.model import DFlashDrafter
from dflashx.dflash.proposal import Sampling, propose, propose_rows
from dflashx.dflash.row_cache import RowKV
from dflashx.dflash.spec_decode import SpecDecoder
from helpers_dflash import config_for
from helpers_dflash2 import perturb_dflash2

torch.set_num_threads(1)
NEW = 40


@pytest.fixture(scope="module", params=FAMILIES)
def tilted(request, tmp_path_factory):
    return tilted_target(tmp_path_factory.mktemp(request.param), request.param)


def _same(batch, single) -> None:
    assert [r.output_ids for r in batch] == [r.output_ids for r in single]
    assert [r.accepted for r in batch] == [r.accepted for r in single]
    assert [r.drafted for r in batch] == [r.drafted for r in single]
    assert [r.target_forwards for r in batch] == [r.target_forwards for r in single]


@pytest.mark.parametrize("architecture", ["dflash", "dflash2"])
def test_a_batch_decodes_each_prompt_as_the_per_prompt_decoder_does(tilted, architecture):
    target, tok = tilted
    draft = drafter(target, tok, architecture)
    ps = prompts()
    alone = [SpecDecoder(target, draft).generate(p, NEW) for p in ps]
    # a stop token some rows reach early and others never do
    stop = next(t for r in alone for t in r.output_ids[2:12]
                if 0 < sum(t in s.output_ids for s in alone) < len(ps))
    single = [SpecDecoder(target, draft).generate(p, NEW, stop_token_ids=[stop]) for p in ps]
    assert any(len(r.output_ids) < NEW and r.output_ids[-1] == stop for r in single)
    assert any(len(r.output_ids) == NEW for r in single)
    assert len({sum(r.accepted) / len(r.accepted) for r in single if r.accepted}) > 2  # rows accept differently
    assert max(a for r in single for a in r.accepted) == draft.config.block_size - 1
    for kw in ({}, {"compact": False}, {"max_rows": 4}):
        decoder = BatchDecoder(target, draft, **kw)
        assert decoder.batched
        _same(decoder.generate(ps, NEW, stop_token_ids=[stop]), single)
        # a batch runs until its longest row ends: its cycles are that row's, per chunk of rows
        chunk = kw.get("max_rows", len(ps))
        assert decoder.cycles == sum(max(len(r.accepted) for r in single[lo: lo + chunk])
                                     for lo in range(0, len(ps), chunk))


def test_eager_attention_is_batched_too(tilted):
    target, tok = tilted
    draft = drafter(target, tok, "dflash")
    target.set_attn_implementation("eager")
    try:
        single = [SpecDecoder(target, draft).generate(p, 24) for p in prompts()]
        decoder = BatchDecoder(target, draft)
        assert decoder.batched
        _same(decoder.generate(prompts(), 24), single)
    finally:
        target.set_attn_implementation("sdpa")


def test_rows_accepting_chosen_counts_get_the_target_greedy_output(monkeypatch):
    """Proposals are the target's greedy continuation (as the per-prompt decoder verifies it: this random target
    has near-ties that `model.generate`'s one-token steps round the other way) with slot `start % B` made wrong,
    so each cycle accepts exactly min(that slot, drafted); prompt lengths far apart make the start identify
    the row."""
    block, new = 4, 24
    target = build_target("qwen3")
    draft = build_drafter(target, block)
    ps = [[7 + i, 3, 19, 42, *((11 + j) % 90 for j in range(30 * i))] for i in range(4)]
    continuations = [SpecDecoder(target, draft).generate(p, new).output_ids for p in ps]
    assert continuations[0] == greedy_reference(target, ps[0], new)
    after = {len(p) + i: c[i + 1 :] for p, c in zip(ps, continuations) for i in range(new)}
    vocab = target.config.vocab_size

    def proposals(start: int, rows: int) -> list[int]:
        want = (after[start] + [0] * block)[: rows - 1]
        if start % block < len(want):
            want[start % block] = (want[start % block] + 1) % vocab
        return want

    def draft_block(ctx, anchor_id, embed, lm_head, rows=None):
        return torch.nn.functional.one_hot(torch.tensor(proposals(ctx.length, rows)), vocab).float()

    def rows(drafter, context_kv, starts, anchors, width, used, *args, **kwargs):
        return torch.tensor([proposals(s, width) for s in starts.tolist()]), None

    draft.draft_block = draft_block
    single = [SpecDecoder(target, draft).generate(p, new) for p in ps]
    monkeypatch.setattr(batch_decode, "propose_rows", rows)
    batch = BatchDecoder(target, draft).generate(ps, new)
    _same(batch, single)
    assert [r.output_ids for r in batch] == continuations
    for p, r in zip(ps, batch):
        starts = [len(p) + sum(a + 1 for a in r.accepted[:i]) for i in range(len(r.accepted))]
        assert r.accepted == [min(s % block, n) for s, n in zip(starts, r.drafted)]
    assert {a for r in batch for a in r.accepted} == set(range(block))


def _drafter(target, architecture: str) -> DFlashDrafter:
    cfg = config_for(target.config, num_layers=2, block_size=6, num_target_layers=2,
                     mask_token_id=target.config.vocab_size - 1, architecture=architecture, selector_rank=16,
                     selector_top_k=4, conv_group_size=16)
    torch.manual_seed(1)
    made = DFlashDrafter(cfg).eval()
    return perturb_dflash2(made, conv=0.5, successor=1.0) if architecture == "dflash2" else made


@pytest.mark.parametrize("architecture", ["dflash", "dflash2"])
def test_blocks_of_a_batch_draft_what_each_block_drafts_alone(architecture):
    """Contexts of different lengths in one buffer (stale values past each row's length), blocks of different
    used rows in one forward: each row's hidden states and drafts are those of its block alone."""
    target = build_target("qwen3")
    draft = _drafter(target, architecture)
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    lengths, used, anchors = [4, 15, 9], [6, 2, 4], torch.tensor([5, 77, 31])
    g = torch.Generator().manual_seed(2)
    feats = [torch.randn(1, n, 128, generator=g) for n in lengths]
    stores = [RowKV(3, 8) for _ in range(draft.config.num_layers)]
    for i, f in enumerate(feats):
        row = torch.tensor([i])
        stale = draft.project_context(torch.randn(1, 12, 128, generator=g), torch.arange(12)[None])
        real = draft.project_context(f, torch.arange(f.shape[1])[None])
        for store, (ks, vs), (k, v) in zip(stores, stale, real):
            store.write(ks, vs, torch.tensor([lengths[i]]), row)  # beyond the row's length: never seen
            store.write(k, v, torch.tensor([0]), row)
    kv = [store.read(max(lengths) + 3) for store in stores]
    starts, width = torch.tensor(lengths), draft.config.block_size
    hidden = draft.rows_hidden(kv, starts, anchors, embed, width, torch.tensor(used))
    tokens, _ = propose_rows(draft, kv, starts, anchors, width, torch.tensor(used), embed, head, Sampling(0.0))
    for i, f in enumerate(feats):
        ctx = draft.extend_context(None, f)
        alone = draft.block_hidden(ctx, int(anchors[i]), embed, used[i])
        torch.testing.assert_close(hidden[i, : used[i] - 1], alone, rtol=1e-5, atol=1e-5)
        assert torch.equal(tokens[i, : used[i] - 1], propose(draft, ctx, int(anchors[i]), used[i] - 1, embed, head)[0])


def test_a_hybrid_target_is_decoded_one_prompt_at_a_time():
    target = build_target("qwen3_5")
    draft = build_drafter(target)
    decoder = BatchDecoder(target, draft)
    assert not decoder.batched and "LinearAttention" in (decoder.reason or "")
    ps = [[7, 3, 19, 42, 11], [5, 60, 8], [33, 2, 9, 14, 27, 81, 4]]
    alone = [SpecDecoder(target, draft).generate(p, 12) for p in ps]
    _same(decoder.generate(ps, 12), alone)
    assert decoder.cycles == sum(len(r.accepted) for r in alone)  # one prompt after another


def test_the_planner_knows_which_targets_decode_batched():
    """The eval's price on a GPU (batched or one prompt at a time) asks the target's facts what the decoder
    asks its cache: the same answer for a dense, a hybrid and a sliding-window target."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from dflashx.targets.read_config import facts_from_config

    sliding = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, sliding_window=8, use_sliding_window=True,
        layer_types=["sliding_attention", "full_attention"]))
    for target in (build_target("qwen3"), build_target("qwen3_5"), sliding):
        facts = facts_from_config(target.config.to_dict())
        assert facts.full_attention_only == (unbatchable(target) is None), target.config.model_type


def test_sliding_window_targets_stay_refused_and_flash_attention_is_not_batched():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                         use_sliding_window=True,
                         layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    sliding = Qwen3ForCausalLM(config).eval()
    assert "SlidingWindow" in (unbatchable(sliding) or "")
    with pytest.raises(NotImplementedError, match="sliding-window"):
        BatchDecoder(sliding, build_drafter(sliding)).generate([[1, 2, 3]], 4)
    dense = build_target("qwen3")
    dense.config._attn_implementation = "flash_attention_2"
    assert "flash_attention_2" in (unbatchable(dense) or "")


def test_a_row_that_ends_at_once_and_one_new_token():
    target = build_target("qwen3")
    draft = build_drafter(target)
    ps = [[7, 3, 19], [5, 60, 8, 33, 2]]
    first = SpecDecoder(target, draft).generate(ps[0], 1).output_ids[0]
    for new, stops in ((1, []), (10, [first])):
        single = [SpecDecoder(target, draft).generate(p, new, stop_token_ids=stops) for p in ps]
        _same(BatchDecoder(target, draft).generate(ps, new, stop_token_ids=stops), single)
    assert single[0].output_ids == [first] and not single[0].accepted


def test_the_memory_estimate_counts_what_the_target_cache_holds(tilted):
    """`batch_rows` sizes GPU batches from the target's cache bytes per token: what a real cache holds per token."""
    from dflashx.dflash.batch_decode import _kv_bytes_per_token, batch_rows

    target, tok = tilted
    with torch.no_grad():
        cache = target(torch.tensor([prompts()[3]]), use_cache=True).past_key_values
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert held == _kv_bytes_per_token(target.config, 4) * len(prompts()[3])
    assert batch_rows(target, drafter(target, tok, "dflash"), prompts(), NEW) == len(prompts())  # a CPU: all
