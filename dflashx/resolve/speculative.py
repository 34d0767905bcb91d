"""Acceptance profiles of speculative decoding, derived once: the target's MTP head while generating
and the DFlash drafter expected before training (pure).

An acceptance profile lists, per draft position k = 1, 2, ..., the share of draft-verify cycles that
accept position k (the eval stage's `acceptance_by_position`; a chain accepts a prefix, so it never
rises with k). A cycle then yields tau = 1 + sum of the shares over the positions it drafts: the
accepted drafts plus the target's own next token.

Published figures (docs/planner.md, "Speculative decoding"):
  MTP       llama.cpp's MTP pull request measured Qwen3.6's MTP head at 1..4 drafts per cycle; an
            aggregate acceptance r_n (accepted / drafted) at n drafts gives position n's share as
            n r_n - (n - 1) r_(n-1). Positions past the published ones count 0 (not measured).
  DFlash    SGLang's DFLASH pull request measured tau for a block-16 DFlash drafter; the profile is the
            geometric one with that tau (share alpha^k, alpha solving 1 + sum alpha^k = tau), cut to the
            recipe's block. A recipe's `deploy.expected_tau` replaces the figure.
  DFlash2   the published block-8 drafter's model card measured tau on GSM8K for Qwen3.8-27B (5.46,
            reproduced at 5.37 by xllm); the same geometric profile through it, at the recipe's block.
            The release's paired comparison (Qwen3.5-4B, same harness: DFlash 4.99 -> DFlash2 6.20 on
            GSM8K, 5.42 -> 6.76 on MATH-500; "about +21% acceptance length") is quoted, not used: it
            measured another target at another block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dflashx.config.architectures import architecture, dflash2
from dflashx.config.architectures.spec import PublishedAcceptance
from dflashx.config.schema import Recipe


MTP_QWEN36 = PublishedAcceptance(
    (0.8835, 0.815, 0.7127, 0.6421),
    "github.com/ggml-org/llama.cpp/pull/22673 (llama + spec: MTP Support), comment of 2026-05-05",
    "aggregate_accept_rate at --spec-draft-n-max 1, 2, 3, 4: 0.8835, 0.815, 0.7127, 0.6421",
    "Qwen3.6-35B-A3B with its MTP head (GGUF), llama-server, one request at a time; the 27B's own profile is "
    "not published, its MTP head has the same design (one full-attention layer on the last hidden state)")
# The published figure DFlash2's expectation starts from (its entry holds it; tests/test_plan_dflash2.py reads it).
DFLASH2_B8 = dflash2.PUBLISHED


def accepted_length(acceptance: Sequence[float | None], drafts: int) -> float:
    """tau of a cycle drafting `drafts` positions: 1 + the shares of positions 1..drafts (missing = 0)."""
    return 1.0 + sum(a or 0.0 for a in list(acceptance)[:drafts])


def profile_from_rates(rates: Sequence[float]) -> list[float]:
    """Per-position shares from aggregate acceptance rates r_n measured at n = 1, 2, ... drafts."""
    totals = [n * r for n, r in enumerate(rates, start=1)]
    return [max(0.0, t - (totals[i - 1] if i else 0.0)) for i, t in enumerate(totals)]


def geometric_profile(tau: float, drafts: int) -> list[float]:
    """alpha^k for k = 1..drafts, alpha in [0, 1] solving 1 + sum alpha^k = tau (1 when tau >= drafts + 1)."""
    if drafts < 1:
        return []
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if 1 + sum(mid**k for k in range(1, drafts + 1)) < tau:
            lo = mid
        else:
            hi = mid
    return [lo**k for k in range(1, drafts + 1)]


def mtp_acceptance(recipe: Recipe) -> list[float]:
    """The MTP head's profile over the recipe's draft steps: the recipe's, else the published one."""
    spec = recipe.stages.generate.serving.speculative
    given = list(spec.acceptance) if spec.acceptance else profile_from_rates(MTP_QWEN36.figures)
    return (given + [0.0] * spec.num_steps)[: spec.num_steps]


def _published_alpha(recipe: Recipe) -> tuple[float, PublishedAcceptance]:
    """The geometric ratio of the published figure for the recipe's drafter architecture."""
    spec = architecture(recipe.drafter.architecture)
    return geometric_profile(spec.published.figures[0], spec.published_block - 1)[0], spec.published


def expected_drafter_acceptance(recipe: Recipe) -> list[float]:
    """Per-position shares of the drafter expected before training: geometric, through `expected_tau`,
    else through the published tau of its architecture, at the recipe's block."""
    if recipe.deploy.expected_tau is not None:
        return geometric_profile(recipe.deploy.expected_tau, recipe.drafter.block_size - 1)
    alpha, _ = _published_alpha(recipe)
    return [alpha**k for k in range(1, recipe.drafter.block_size)]


def expected_tau(recipe: Recipe) -> float:
    """The tau a drafter of the recipe's architecture and block is expected to reach before it is trained."""
    if recipe.deploy.expected_tau is not None:
        return recipe.deploy.expected_tau
    return accepted_length(expected_drafter_acceptance(recipe), recipe.drafter.block_size - 1)


def tau_source(recipe: Recipe) -> str:
    if recipe.deploy.expected_tau is not None:
        return "deploy.expected_tau (the recipe)"
    _, figure = _published_alpha(recipe)
    block = architecture(recipe.drafter.architecture).published_block
    served = recipe.deploy.temperature
    sampled = (f"; measured greedily, while deploy.temperature is {served:g} (rejection sampling accepts less or "
               "more than greedy; the eval measures it): set deploy.expected_tau for the served figure"
               if served > 0 else "")
    return (f"{figure.source}: {figure.figure} ({figure.conditions}); geometric profile of the block-{block} "
            f"figure at the recipe's block{sampled}")
