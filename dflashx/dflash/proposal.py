"""The drafter's proposal in one decode cycle: the drafted tokens and, when sampling, their draft
distributions q (what rejection sampling compares the target's p with).

Each architecture proposes from the drafted rows' final hidden states (`TorchHalf.propose`, its registry entry's
torch half):
- DFlash: the argmax of each drafted row's logits, or a sample of the serving distribution
  `probs(logits, T, top_p, top_k)` (q over the full vocabulary, filtered as the target's p is): `choose`.
- DFlash2: the path selector's walk from the anchor over the rows' final hidden states and unary
  logits (`dflash2.PathSelector.walk`): the best candidate, or a sample of softmax(S / T) over the
  top-k candidates (q zero outside them), as the reference's `DFlash2DraftModel.propose` (which
  applies no top-p / top-k to it: any q keeps rejection sampling exact, only p must be filtered).

The block drafted has n + 1 rows (the anchor and n masks): B - 1 drafts, or fewer at the end of
generation, where the reference (`dflash` 0.1.0, `dflash_generate`) drafts only as many as can still
become output tokens.

When sampling, the draws come from `generator` in the reference's order (the drafts row by row, one
uniform per draft, then the bonus or residual token), so that a generator seeded as the reference's
global one reproduces its sampled decoding (`tests/test_tau_reference.py`).

The serving distribution is the reference's (`dflash` 0.1.0, `_sampling_probs`): softmax of the
logits over T, kept to the top_k highest (0: all), then to the smallest set of the most likely
tokens whose mass reaches top_p (the token that crosses it included), renormalized.

Public API: `Sampling(temperature, top_p=1.0, top_k=0)`, `probs(logits, temperature, top_p=1.0,
top_k=0)`, `sample(probs, generator)`, `choose(logits, sampling, generator) -> (tokens, q | None)` (a DFlash
drafter's pick), `propose(drafter, ctx, anchor, n, embed, lm_head, temperature=0.0, generator=None,
top_p=1.0, top_k=0) -> (tokens [n], q [n, V] | None)`, `propose_rows(drafter, context_kv, starts, anchors,
rows, used, embed, lm_head, sampling, generator=None) -> (tokens [b, rows-1], q [b, rows-1, V] | None)`
(b blocks at once: `dflashx.dflash.batch_decode`).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from dflashx.dflash.architecture import torch_half
from dflashx.dflash.model import KV, DFlashDrafter, DraftContext

Head = Callable[[torch.Tensor], torch.Tensor]


class Sampling(NamedTuple):
    """The serving distribution's settings: `probs(logits, *sampling)`."""

    temperature: float
    top_p: float = 1.0
    top_k: int = 0


def probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """The serving distribution over the last dimension (module doc), in fp32."""
    scores = logits.float() / temperature
    indices = None
    if 0 < top_k < scores.shape[-1]:
        scores, indices = torch.topk(scores, top_k, dim=-1)
    out = torch.softmax(scores, dim=-1)
    if top_p < 1.0:
        ranked, order = out.sort(dim=-1, descending=True)
        ranked = ranked * (ranked.cumsum(dim=-1) - ranked < top_p)
        out = torch.zeros_like(out).scatter(-1, order, ranked)
        out = out / out.sum(dim=-1, keepdim=True)
    if indices is not None:
        out = torch.zeros_like(logits, dtype=out.dtype).scatter(-1, indices, out)
    return out


def sample(distribution: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of `distribution` [..., V] (the rows drawn in order, first to last)."""
    flat = distribution.reshape(-1, distribution.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(distribution.shape[:-1])


def choose(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None
           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A DFlash drafter's tokens from its logits [..., V]: the argmax (temperature <= 0), or a sample of the
    serving distribution q, returned with it."""
    logits = logits.float()
    if sampling.temperature <= 0:
        return logits.argmax(-1), None
    q = probs(logits, *sampling)
    return sample(q, generator), q


@torch.no_grad()
def propose(drafter: DFlashDrafter, ctx: DraftContext, anchor: int, n: int, embed: Head, lm_head: Head,
            temperature: float = 0.0, generator: torch.Generator | None = None, top_p: float = 1.0,
            top_k: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """n drafted tokens after `anchor` (a block of n + 1 rows) and their draft distributions q [n, V]
    (None when greedy)."""
    return torch_half(drafter.config.architecture).propose(drafter, ctx, anchor, n + 1, embed, lm_head,
                                                           Sampling(temperature, top_p, top_k), generator)


@torch.no_grad()
def propose_rows(drafter: DFlashDrafter, context_kv: list[KV], starts: torch.Tensor, anchors: torch.Tensor,
                 rows: int, used: torch.Tensor, embed: Head, lm_head: Head, sampling: Sampling,
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`propose` for b blocks at once (`DFlashDrafter.rows_hidden`): block i of `used[i]` rows (at most
    `rows`) after anchors[i] at positions starts[i]..; tokens [b, rows-1] and q [b, rows-1, V] (None when
    greedy). Past a block's own rows the tokens are filler: what a decoder verifies there it discards."""
    hidden = drafter.rows_hidden(context_kv, starts, anchors, embed, rows, used)
    return torch_half(drafter.config.architecture).propose_rows(drafter, hidden, lm_head, anchors, sampling, generator)
