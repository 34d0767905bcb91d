"""The batched speculative decoder at a serving temperature: a batch of one draws exactly what `SpecDecoder`
draws (so what the z-lab reference draws); in a batch of many each row still samples from the target's own
distribution (the marginals of the emitted tokens), τ over seeds agrees with the per-prompt decoder's in
law, and a drafter proposing the target's own distribution has every draft accepted.

Seeded: every figure below is deterministic; the statistical ones hold with the stated tolerances."""

from __future__ import annotations

import statistics

import pytest
import torch
from helpers_batch import drafter, prompts, tilted_target
from test_spec_decode import _tv, build_drafter, build_target

from dflashx.dflash.acceptance import summarize
from dflashx.dflash.batch_decode import BatchDecoder
from dflashx.dflash.spec_decode import SpecDecoder
from helpers_dflash import config_for

torch.set_num_threads(1)
SERVING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}


@pytest.fixture(scope="module")
def tilted(tmp_path_factory):
    return tilted_target(tmp_path_factory.mktemp("qwen3"), "qwen3")


@pytest.mark.parametrize("architecture", ["dflash", "dflash2"])
def test_a_batch_of_one_draws_what_the_per_prompt_decoder_draws(tilted, architecture):
    target, tok = tilted
    draft = drafter(target, tok, architecture)
    ps = prompts()
    single = [SpecDecoder(target, draft).generate(p, 32, generator=gen, **SERVING)
              for gen in [torch.Generator().manual_seed(3)] for p in ps]
    batch = BatchDecoder(target, draft, max_rows=1).generate(ps, 32, generator=torch.Generator().manual_seed(3),
                                                             **SERVING)
    assert [r.output_ids for r in batch] == [r.output_ids for r in single]
    assert [r.accepted for r in batch] == [r.accepted for r in single]
    assert any(a > 0 for r in single for a in r.accepted)


@pytest.mark.parametrize("architecture", ["dflash", "dflash2"])
def test_every_row_of_a_batch_samples_the_target_distribution(architecture):
    """The 2nd and 3rd emitted tokens of two prompts, 3,000 rows each in one batch, against their exact marginals
    (6-token vocabulary, temperature 1: as the per-prompt test_spec_decode checks one prompt at a time)."""
    target = build_target("qwen3", seed=3, vocab=6)
    draft = build_drafter(target, block_size=3, seed=4)
    if architecture == "dflash2":
        cfg = config_for(target.config, num_layers=1, block_size=3, num_target_layers=2, mask_token_id=5,
                         architecture="dflash2", selector_rank=8, selector_top_k=4, conv_group_size=16)
        torch.manual_seed(4)
        draft = type(draft)(cfg).eval()
    ps, rows = [[1, 2, 3], [4, 0, 2, 2, 1, 3]], 3000

    def after(prefix: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return torch.softmax(target(torch.tensor([prefix])).logits[0, -1], -1)

    out = BatchDecoder(target, draft).generate([p for p in ps for _ in range(rows)], 3, temperature=1.0,
                                               generator=torch.Generator().manual_seed(0))
    for i, p in enumerate(ps):
        first = after(p)
        second = torch.stack([after(p + [x]) for x in range(6)])
        third = torch.stack([torch.stack([after(p + [x, y]) for y in range(6)]) for x in range(6)])
        pair = first[:, None] * second
        emitted = torch.tensor([r.output_ids for r in out[i * rows : (i + 1) * rows]])
        for k, marginal in ((1, pair.sum(0)), (2, (pair[..., None] * third).sum((0, 1)))):
            assert _tv(torch.bincount(emitted[:, k], minlength=6).float(), marginal) < 0.04
    assert sum(sum(r.accepted) for r in out) > 0.3 * len(out)  # drafts were accepted (not only corrections)


def test_tau_over_seeds_agrees_with_the_per_prompt_decoders(tilted):
    """Sampled τ (pooled over the prompts) per seed, 8 seeds each: the means within two combined standard errors."""
    target, tok = tilted
    draft = drafter(target, tok, "dflash")
    ps, seeds = prompts()[:4], range(8)
    single = [summarize([SpecDecoder(target, draft).generate(p, 32, generator=gen, **SERVING) for p in ps], 6)["tau"]
              for s in seeds for gen in [torch.Generator().manual_seed(s)]]
    batch = [summarize(BatchDecoder(target, draft).generate(ps, 32, generator=torch.Generator().manual_seed(100 + s),
                                                            **SERVING), 6)["tau"] for s in seeds]
    se = (statistics.variance(single) / len(single) + statistics.variance(batch) / len(batch)) ** 0.5
    assert se > 0 and min(batch) > 1.0
    assert abs(statistics.mean(single) - statistics.mean(batch)) <= 2 * se, (single, batch)


def test_a_drafter_proposing_the_target_distribution_has_every_draft_accepted():
    """A target whose every token has the same embedding and whose layers add nothing predicts one distribution
    p everywhere; a drafter whose layers add nothing and whose final norm is the target's proposes exactly p.
    Then u q < p for every uniform u < 1: every draft of every row is accepted, the last blocks cut short too."""
    target = build_target("qwen3")
    draft = build_drafter(target, block_size=5)
    with torch.no_grad():
        target.get_input_embeddings().weight.copy_(target.get_input_embeddings().weight[:1].clone())
        for layer in [*target.model.layers, *draft.layers]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        draft.norm.weight.copy_(target.model.norm.weight)
    ps = [[1, 2, 3], [9, 8, 7, 6, 5, 4, 3, 2], [40]]
    for new in (17, 20):
        out = BatchDecoder(target, draft).generate(ps, new, generator=torch.Generator().manual_seed(0), **SERVING)
        blocks, length = [], 1  # full accepts: B tokens a cycle, the last block as long as what is left
        while length < new:
            blocks.append(min(4, new - length))
            length += blocks[-1] + 1
        assert all(r.drafted == blocks and r.accepted == blocks and len(r.output_ids) == new for r in out)
