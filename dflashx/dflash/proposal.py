"""The drafter's proposal in one decode cycle: the drafted tokens and, when sampling, their draft
distributions q (what rejection sampling compares the target's p with).

- DFlash: the argmax of each drafted row's logits, or a sample of softmax(logits / T) (q over the
  full vocabulary).
- DFlash2: the path selector's walk from the anchor over the rows' final hidden states and unary
  logits (`dflash2.PathSelector.walk`): the best candidate, or a sample of softmax(S / T) over the
  top-k candidates (q zero outside them), as the reference's `DFlash2DraftModel.propose`.

The block drafted has `rows` rows: the block size, or fewer at the end of generation, where the
reference (`dflash` 0.1.0, `dflash_generate`) drafts only the rows it will verify; the decoder
keeps the first n drafts of it.

Public API: `probs(logits, temperature)`, `sample(probs, generator)`, `propose(drafter, ctx, anchor,
n, rows, embed, lm_head, temperature=0.0, generator=None) -> (tokens [n], q [n, V] | None)`.
"""

from __future__ import annotations

from typing import Callable

import torch

from dflashx.dflash.model import DFlashDrafter, DraftContext

Head = Callable[[torch.Tensor], torch.Tensor]


def probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) in fp32."""
    return torch.softmax(logits.float() / temperature, dim=-1)


def sample(distribution: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of `distribution` [..., V]."""
    return torch.multinomial(distribution, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def propose(drafter: DFlashDrafter, ctx: DraftContext, anchor: int, n: int, rows: int, embed: Head, lm_head: Head,
            temperature: float = 0.0, generator: torch.Generator | None = None
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """n drafted tokens after `anchor` from a block of `rows` rows (n < rows), and their draft
    distributions q [n, V] (None when greedy)."""
    if drafter.candidate_selector is None:
        logits = drafter.draft_block(ctx, anchor, embed, lm_head, rows=rows)[:n].float()
        if temperature <= 0:
            return logits.argmax(-1), None
        q = probs(logits, temperature)
        return sample(q, generator), q
    hidden = drafter.block_hidden(ctx, anchor, embed, rows)[:n]
    return drafter.candidate_selector.walk(hidden, lm_head(hidden), anchor, temperature, generator)
