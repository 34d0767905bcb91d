"""DFlash2 against the z-lab reference (`dflash` 0.1.0, `DFlash2DraftModel`, `dflash_generate`),
imported from the unpacked wheel as in test_tau_reference.py (its CUDA clock replaced, nothing else).

- a drafter with every DFlash2 parameter random, saved by `save_drafter`, loads into the reference
  with no missing or unexpected key, and drafts the same block (hidden states, logits, path);
- greedy decoding with a partly right drafter: the target's own greedy output, the reference's
  per-cycle acceptance lengths, the same tau (strictly between 1 and B);
- sampling at T = 0.6: the mean tau over 5 seeds agrees with the reference's within two combined
  standard errors, and each seed decodes the reference's tokens (the reference draws from the global
  RNG, ours from a generator seeded alike, in the same order: `helpers_reference.sampled_taus`).
"""

from __future__ import annotations

import collections
import time

import pytest
import torch
from helpers_dflash import load_target, tiny_target
from helpers_reference import assert_sampled_agree, sampled_taus, zlab_reference
from helpers_dflash2 import partly_right_drafter, random_drafter

from dflashx.dflash.checkpoint import load_drafter, save_drafter
from dflashx.dflash.spec_decode import SpecDecoder

N, BLOCK, HEAD_SCALE, SEEDS = 24, 4, 20.0, 5


@pytest.fixture(scope="module")
def ref():
    module = zlab_reference()
    module._cuda_time = time.perf_counter  # torch.cuda.synchronize cannot run on CPU; no figure depends on it
    return module


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The tiny target (its LM head scaled up after the drafter is built: the same greedy output,
    sharper distributions to sample), prompts, their greedy outputs and the partly right drafter."""
    root = tmp_path_factory.mktemp("dflash2")
    model, tok = load_target(tiny_target(root / "target"))
    prompts = [tok(f"add {i} and {i + 3}")["input_ids"] for i in range(6)]
    greedy = [model.generate(torch.tensor([p]), max_new_tokens=N, do_sample=False)[0, len(p):].tolist()
              for p in prompts]
    token = collections.Counter(t for out in greedy for t in out).most_common(1)[0][0]
    save_drafter(partly_right_drafter(model, tok, token, block_size=BLOCK), root / "drafter")
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(HEAD_SCALE)
    return model, tok, prompts, greedy, root / "drafter"


def _theirs(ref, folder):
    return ref.DFlash2DraftModel.from_pretrained(str(folder), dtype=torch.float32).eval()


def test_reference_loads_our_dflash2_export_and_drafts_the_same_block(setup, ref, tmp_path):
    model, tok, *_ = setup
    ours = random_drafter(model, tok, num_layers=2, block_size=BLOCK, layer_types=["sliding_attention",
                          "full_attention"], sliding_window=6)
    save_drafter(ours, tmp_path / "d")
    theirs, info = ref.DFlash2DraftModel.from_pretrained(str(tmp_path / "d"), dtype=torch.float32,
                                                          output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert theirs.state_dict().keys() == ours.state_dict().keys()
    assert all(torch.equal(v, ours.state_dict()[k]) for k, v in theirs.state_dict().items())
    assert not any(layer.self_attn.is_causal for layer in theirs.layers)  # is_causal: false, as we train
    assert [layer.self_attn.sliding_window for layer in theirs.layers] == [6, None]
    assert (theirs.candidate_selector.top_k, theirs.block_size) == (4, BLOCK)

    t, anchor = 9, 42
    feats = torch.randn(1, t, 2 * 64, generator=torch.Generator().manual_seed(0))
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    for rows in (BLOCK, BLOCK - 1):  # a full block, and one cut short as at the end of generation
        ids = torch.tensor([[anchor] + [ours.config.mask_token_id] * (rows - 1)])
        with torch.no_grad():
            hidden = theirs(position_ids=torch.arange(t + rows)[None], noise_embedding=embed(ids),
                            target_hidden=feats)[:, 1:]
            path, _, _ = theirs.propose(hidden, ids[:, 0], head, 0.0)
        mine = ours.block_hidden(ours.extend_context(None, feats), anchor, embed, rows)
        assert torch.allclose(mine, hidden[0], atol=1e-5)
        assert torch.allclose(head(mine), theirs.compute_logits(hidden, head)[0], atol=1e-4)
        assert ours.candidate_selector.walk(mine, head(mine), anchor)[0].tolist() == path[0].tolist()


def test_greedy_decoding_matches_the_reference_cycle_by_cycle(setup, ref):
    model, _, prompts, greedy, folder = setup
    drafter, theirs = load_drafter(folder).eval(), _theirs(ref, folder)
    ours = SpecDecoder(model, drafter)
    results, lengths = [], []
    for prompt, target_out in zip(prompts, greedy):
        stats = ref.dflash_generate(theirs, model, torch.tensor([prompt]), N, None, return_stats=True)
        mine = ours.generate(prompt, N)
        assert mine.output_ids == target_out == stats.output_ids[0, len(prompt):].tolist()
        assert stats.acceptance_lengths == [a + 1 for a in mine.accepted]  # no stop token: none cut short
        results.append(mine)
        lengths += stats.acceptance_lengths
    tau = sum(r.decoded_after_first for r in results) / sum(len(r.accepted) for r in results)
    assert tau == pytest.approx(sum(lengths) / len(lengths), abs=0.01)
    assert 1.0 < tau < BLOCK
    # the selector acted: somewhere along these decodings its path is not the unary argmax
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    overturned = 0
    for prompt, out in zip(prompts, greedy):
        seq = prompt + out
        with torch.no_grad():
            states = model(torch.tensor([seq]), output_hidden_states=True).hidden_states
        feats = torch.cat([states[i + 1] for i in drafter.config.target_layer_ids], dim=-1)
        for end in range(len(prompt), len(seq) - 1, 4):
            hidden = drafter.block_hidden(drafter.extend_context(None, feats[:, :end]), seq[end], embed)
            path, _ = drafter.candidate_selector.walk(hidden, head(hidden), seq[end])
            overturned += int((path != head(hidden).argmax(-1)).sum())
    assert overturned > 0


def test_sampled_tau_agrees_with_the_reference(setup, ref):
    """At T 0.6 over 5 seeds: the means within two combined SE, and each seed's decodings the reference's."""
    model, _, prompts, _, folder = setup
    ours = SpecDecoder(model, load_drafter(folder).eval())
    compared = sampled_taus(ref, _theirs(ref, folder), ours, prompts, N, {"temperature": 0.6}, seeds=SEEDS)
    assert_sampled_agree(compared)
    assert min(compared.mine + compared.reference) > 1.0  # drafts are accepted when sampling
