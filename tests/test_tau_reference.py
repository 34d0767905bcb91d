"""tau as the reference DFlash loop counts it, run beside ours on the same drafter and prompts.

The reference is the z-lab `dflash` 0.1.0 wheel from PyPI, unpacked and imported as it is
(`helpers_reference.zlab_reference`; not installed, because its pins would replace this environment's
`datasets`, `tqdm` and `huggingface_hub`). Its `dflash_generate(..., return_stats=True)` returns
`acceptance_lengths`: the tokens each draft-verify cycle added. It times itself with
`torch.cuda.synchronize()`, which cannot run on a CPU-only torch; that clock (`_cuda_time`) is the
one thing replaced here (by `time.perf_counter`), and no figure compared below depends on it.

The drafter drafts one fixed token (`helpers_dflash.repeating_drafter`), so cycles accept from 0
to all B-1 drafts; with that token also a stop token, a cycle that accepted it stops in its middle:
the case where counting "accepted + 1" and counting the tokens kept differ.
"""

from __future__ import annotations

import collections
import time

import pytest
import torch
from helpers_dflash import load_target, repeating_drafter, tiny_target
from helpers_reference import assert_sampled_agree, sampled_taus, zlab_reference

from dflashx.dflash.acceptance import summarize
from dflashx.dflash.checkpoint import load_drafter, save_drafter
from dflashx.dflash.proposal import probs
from dflashx.dflash.spec_decode import SpecDecoder

N = 24


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("tau")
    model, tok = load_target(tiny_target(root / "target"))
    prompts = [tok(f"add {i} and {i + 3}")["input_ids"] for i in range(6)]
    greedy = [model.generate(torch.tensor([p]), max_new_tokens=N, do_sample=False)[0, len(p):].tolist()
              for p in prompts]
    token = collections.Counter(t for out in greedy for t in out).most_common(1)[0][0]
    save_drafter(repeating_drafter(model, tok, token), root / "drafter")
    return model, prompts, greedy, token, root / "drafter"


@pytest.mark.parametrize("use_stop", [False, True])
def test_our_tau_is_the_references_pooled_acceptance_length(setup, monkeypatch, use_stop):
    model, prompts, greedy, token, folder = setup
    ref = zlab_reference()
    monkeypatch.setattr(ref, "_cuda_time", time.perf_counter)  # torch.cuda.synchronize cannot run on CPU
    theirs = ref.DFlashDraftModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    ours = SpecDecoder(model, load_drafter(folder).eval())
    stops = [token] if use_stop else []  # stopping on the drafted token cuts cycles that accepted it
    results, lengths = [], []
    for prompt, target_out in zip(prompts, greedy):
        stats = ref.dflash_generate(theirs, model, torch.tensor([prompt]), N, stops or None, return_stats=True)
        mine = ours.generate(prompt, N, stop_token_ids=stops)
        results.append(mine)
        lengths.append(stats.acceptance_lengths)
        # the same decoding: the target's own greedy output (up to and including a stop token)
        assert stats.output_ids[0, len(prompt):].tolist() == mine.output_ids
        cut = next((i + 1 for i, t in enumerate(target_out) if t in stops), N)
        assert mine.output_ids == target_out[:cut]
        # per prompt: one reference cycle per cycle of ours, the same tokens in all
        assert len(stats.acceptance_lengths) == len(mine.accepted)
        assert sum(stats.acceptance_lengths) == mine.decoded_after_first
    pooled = sum(map(sum, lengths)) / sum(map(len, lengths))
    summary = summarize(results, block_size=4)
    assert summary["tau"] == pytest.approx(pooled, rel=1e-12)
    if use_stop:  # cycles that accepted drafts were cut at their first token: accepted + 1 counts what
        assert summary["accepted_plus_one"] > summary["tau"]  # they discarded, the reference does not
    else:
        assert 1.0 < summary["tau"] < 4.0  # drafts are accepted, but not all of them
        assert summary["accepted_plus_one"] == pytest.approx(summary["tau"])  # no cycle was cut short


@pytest.mark.parametrize("temperature, top_p, top_k", [(0.6, 1.0, 0), (0.6, 0.95, 20), (1.0, 0.5, 0), (0.7, 1.0, 3)])
def test_the_serving_distribution_is_the_references(temperature, top_p, top_k):
    """`proposal.probs` (what our target and DFlash drafter sample from) equals the reference's
    `_sampling_probs` at the same settings, row for row."""
    ref = zlab_reference()
    logits = torch.randn(6, 320, generator=torch.Generator().manual_seed(0)) * 4
    ours, theirs = probs(logits, temperature, top_p, top_k), ref._sampling_probs(logits, temperature, top_p, top_k)
    assert torch.allclose(ours, theirs, atol=1e-7)
    kept = (ours > 0).sum(-1)
    assert (kept <= (top_k or 320)).all() and ((kept < 320).all() if top_p < 1 or top_k else (kept == 320).all())


def test_sampled_tau_at_the_serving_settings_agrees_with_the_reference(setup, monkeypatch):
    """DFlash at temperature 0.6, top_p 0.95, top_k 20 (the seeds' serving settings): over 5 seeds each, our
    mean tau and the reference's lie within two standard errors of their difference, and a seed decodes
    the reference's tokens (both draw from the same stream in the same order)."""
    model, prompts, _, _, folder = setup
    ref = zlab_reference()
    monkeypatch.setattr(ref, "_cuda_time", time.perf_counter)
    theirs = ref.DFlashDraftModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    ours = SpecDecoder(model, load_drafter(folder).eval())
    compared = sampled_taus(ref, theirs, ours, prompts, N, {"temperature": 0.6, "top_p": 0.95, "top_k": 20})
    assert_sampled_agree(compared)
    assert min(compared.mine + compared.reference) > 1.0  # drafts are accepted when sampling
