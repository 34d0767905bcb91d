"""Speculative decoding: exactness against the target's own greedy decoding (dense Qwen3 and the
hybrid Qwen3.5 with Gated DeltaNet layers), an oracle drafter reaching tau = B, partial accepts
exercising the cache rollback, and the rejection rule's output distribution.

Targets are tiny random models built in memory (seeded); nothing is mocked except the drafter's
proposals in the oracle tests (`draft_block` is replaced to propose chosen tokens)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from dflashx.dflash.config import DFlashConfig
from helpers_dflash import config_for
from dflashx.dflash.masks import DraftMask
from dflashx.dflash.model import DFlashDrafter
from dflashx.dflash.spec_decode import SpecDecoder, rejection_sample

torch.set_num_threads(1)
VOCAB = 96
_COMMON = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512, "tie_word_embeddings": False}


def build_target(arch: str, seed: int = 0, vocab: int = VOCAB) -> torch.nn.Module:
    torch.manual_seed(seed)
    common = _COMMON | {"vocab_size": vocab}
    if arch == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=4, **common)).eval()
    config = Qwen3_5TextConfig(
        num_hidden_layers=4, layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        linear_conv_kernel_dim=4, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, **common,
    )
    return Qwen3_5ForCausalLM(config).eval()


def build_drafter(target: torch.nn.Module, block_size: int = 4, seed: int = 1) -> DFlashDrafter:
    cfg = config_for(target.config, num_layers=1, block_size=block_size, num_target_layers=2,
                     mask_token_id=target.config.vocab_size - 1)
    torch.manual_seed(seed)
    return DFlashDrafter(cfg).eval()


def greedy_reference(target: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    out = target.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def oracle(drafter: DFlashDrafter, prompt: list[int], continuation: list[int], corrupt_slot=None) -> None:
    """Make the drafter propose the target's greedy continuation (slot `corrupt_slot(cycle)` made wrong)."""
    vocab, cycle = drafter.config.vocab_size, [0]

    def draft_block(ctx, anchor_id, embed, lm_head, rows=None):
        start = ctx.length - len(prompt)  # index of the anchor in the continuation
        want = (continuation + [0] * drafter.config.block_size)[start + 1 : start + drafter.config.block_size]
        bad = corrupt_slot(cycle[0]) if corrupt_slot else None
        cycle[0] += 1
        if bad is not None:
            want[bad] = (want[bad] + 1) % vocab
        return torch.nn.functional.one_hot(torch.tensor(want), vocab).float() * 10

    drafter.draft_block = draft_block


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def target(request):
    return build_target(request.param)


PROMPT = [7, 3, 19, 42, 11, 5, 60, 8, 33, 2]


def test_greedy_with_untrained_drafter_is_the_target_greedy_output(target):
    ref = greedy_reference(target, PROMPT, 25)
    result = SpecDecoder(target, build_drafter(target)).generate(PROMPT, 25)
    assert result.output_ids == ref
    assert len(result.accepted) == len(result.drafted) and result.tau >= 1.0


def test_oracle_drafter_reaches_tau_equal_to_block_size(target):
    block, cycles = 4, 5
    n = 1 + cycles * block  # first token from the prefill, then full blocks
    ref = greedy_reference(target, PROMPT, n)
    drafter = build_drafter(target, block)
    oracle(drafter, PROMPT, ref)
    result = SpecDecoder(target, drafter).generate(PROMPT, n)
    assert result.output_ids == ref
    assert result.accepted == [block - 1] * cycles
    assert result.tau == block
    assert result.target_forwards == 1 + cycles


def test_partial_accepts_roll_the_cache_back_exactly(target):
    """Draft slot c of cycle i is wrong: exactly c drafts are accepted, and the output stays exact."""
    block, n = 4, 30
    ref = greedy_reference(target, PROMPT, n)
    drafter = build_drafter(target, block)
    pattern = [0, 2, 1, 2, 0, 1]
    oracle(drafter, PROMPT, ref, corrupt_slot=lambda i: pattern[i % len(pattern)])
    result = SpecDecoder(target, drafter).generate(PROMPT, n)
    assert result.output_ids == ref
    full = [min(c, d) for c, d in zip((pattern * 10)[: len(result.accepted)], result.drafted)]
    assert result.accepted == full


def test_stop_token_ends_decoding_after_it(target):
    ref = greedy_reference(target, PROMPT, 20)
    stop = ref[6]
    first = ref.index(stop)
    drafter = build_drafter(target)
    oracle(drafter, PROMPT, ref)
    result = SpecDecoder(target, drafter).generate(PROMPT, 20, stop_token_ids=[stop])
    assert result.output_ids == ref[: first + 1]


def _tv(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - probs).abs().sum())


def test_rejection_sampling_reproduces_the_target_distribution():
    """Emitted tokens follow p whatever q is (Leviathan et al. 2023, Thm 1); seeded, tolerant."""
    gen = torch.Generator().manual_seed(0)
    vocab, draws = 5, 20000
    p = torch.tensor([[0.5, 0.2, 0.1, 0.1, 0.1], [0.05, 0.05, 0.6, 0.2, 0.1], [0.2, 0.2, 0.2, 0.2, 0.2]])
    q = torch.tensor([[0.1, 0.6, 0.1, 0.1, 0.1], [0.2, 0.2, 0.2, 0.2, 0.2]])
    first, second = torch.zeros(vocab), torch.zeros(vocab)
    accepted_total = 0
    for _ in range(draws):
        drafts = torch.multinomial(q, 1, generator=gen).squeeze(-1)
        accepted, nxt = rejection_sample(drafts, q, p, gen)
        emitted = [*drafts[:accepted].tolist(), nxt]
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second[emitted[1]] += 1
        accepted_total += accepted
    assert _tv(first, p[0]) < 0.02
    assert _tv(second, p[1]) < 0.03
    # a slot is accepted with probability sum_x min(p, q): 0.6 for both slots, so E[accepted] = 0.6 + 0.6^2
    assert abs(accepted_total / draws - 0.96) < 0.02


def test_sampled_speculative_decoding_matches_target_sampling():
    """End to end on a 6-token vocabulary: the 2nd generated token's frequency against its exact marginal."""
    target = build_target("qwen3", seed=3, vocab=6)
    drafter = build_drafter(target, block_size=3, seed=4)
    prompt, temp, draws = [1, 2, 3], 1.0, 1500
    with torch.no_grad():
        p1 = torch.softmax(target(torch.tensor([prompt])).logits[0, -1] / temp, -1)
        rows = torch.stack([torch.softmax(target(torch.tensor([prompt + [x]])).logits[0, -1] / temp, -1)
                            for x in range(6)])
    marginal = (p1[:, None] * rows).sum(0)
    decoder, gen = SpecDecoder(target, drafter), torch.Generator().manual_seed(0)
    counts = torch.zeros(6)
    for _ in range(draws):
        counts[decoder.generate(prompt, 2, temperature=temp, generator=gen).output_ids[1]] += 1
    assert _tv(counts, marginal) < 0.06


@pytest.mark.parametrize("kinds", [("full_attention", False), ("sliding_attention", True)])
def test_drafting_from_the_grown_context_matches_the_training_forward(kinds):
    """The decode-time context (grown a few positions per cycle, each projected once) drafts the same
    logits as the training forward, which projects the whole context for a block anchored at T."""
    layer_type, causal = kinds
    cfg = DFlashConfig(num_layers=2, block_size=4, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, intermediate_size=48, vocab_size=50, target_layer_ids=[0, 1], num_target_layers=4,
                       mask_token_id=1, layer_types=[layer_type] * 2, causal_layers=[causal] * 2, sliding_window=6)
    torch.manual_seed(0)
    d = DFlashDrafter(cfg).eval()
    embed, head = torch.nn.Embedding(50, 32), torch.nn.Linear(32, 50, bias=False)
    feats = torch.randn(1, 13, 64)
    ctx = None
    for lo, hi in [(0, 5), (5, 6), (6, 10), (10, 13)]:
        ctx = d.extend_context(ctx, feats[:, lo:hi])
    assert ctx.length == 13 and ctx.kv[0][0].shape[2] == 13
    cached = d.draft_block(ctx, 7, embed, head)

    t = feats.shape[1]
    ids = torch.tensor([[7, 1, 1, 1]])
    with torch.no_grad():
        hidden = d(embed(ids), d.fuse(feats), torch.arange(t, t + 4)[None], torch.arange(t)[None],
                   DraftMask(torch.tensor([[t]]), t, 4, backend="sdpa"))
    assert torch.allclose(cached, head(hidden[0, 1:]), atol=1e-5)
    # and the context matters: drafting from a shorter context differs
    assert not torch.allclose(cached, d.draft_block(d.extend_context(None, feats[:, :12]), 7, embed, head))
