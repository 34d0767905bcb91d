"""One cycle's verification, for b blocks at once: how many drafts each block keeps and the token after them.

- Greedy: the longest prefix of drafts equal to the target's argmax, and the target's argmax after it (the
  bonus, or the correction at the first mismatch): the output is the target's greedy output.
- Sampled (Leviathan et al. 2023, arXiv 2211.17192, Thm. 1; Chen et al. 2023, arXiv 2302.01318): draft x_i is
  accepted with probability min(1, p_i(x_i) / q_i(x_i)) (one uniform per draft: accepted when u q < p); at the
  first rejection the next token is drawn from norm(max(0, p_i - q_i)) (p_i itself when that is zero), after
  a full accept from p after the last draft. The emitted tokens are then distributed exactly as sampling
  from p alone, whatever q is.

Every block has `limits[i]` drafts that count (the rest of its row is filler, never accepted: a block cut
short at the end of generation). Draws: the uniforms [b, n] in one call, then one next token per block in
one call; for one block that is the order the z-lab reference draws in (`dflashx.dflash.proposal`).

Public API: `greedy_accept(drafts [b, n], logits [b, n+1, V], limits=None) -> (accepted [b], next [b])`,
`rejection_accept(drafts [b, n], q [b, n, V], p [b, n+1, V], limits=None, generator=None) -> (accepted [b],
next [b])`.
"""

from __future__ import annotations

import torch

from dflashx.dflash.proposal import sample


def _counted(ok: torch.Tensor, limits: torch.Tensor | None) -> torch.Tensor:
    """Length of the leading run of True in each row of ok [b, n], counting only the first limits[i]."""
    if limits is not None:
        ok = ok & (torch.arange(ok.shape[1], device=ok.device) < limits[:, None])
    return ok.int().cumprod(dim=1).sum(dim=1)


def _at(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [b, L, V] at position index [b] of each row: [b, V]."""
    return x.gather(1, index[:, None, None].expand(-1, 1, x.shape[-1]))[:, 0]


def greedy_accept(drafts: torch.Tensor, logits: torch.Tensor, limits: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification of drafts [b, n] against the target's logits [b, n+1, V] over anchor + drafts."""
    best = logits.argmax(-1)
    accepted = _counted(drafts == best[:, : drafts.shape[1]], limits)
    return accepted, best.gather(1, accepted[:, None])[:, 0]


def rejection_accept(drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor, limits: torch.Tensor | None = None,
                     generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling of drafts [b, n] with draft distributions q [b, n, V] against the target's p [b, n+1, V]
    (at the anchor and after each draft)."""
    b, n = drafts.shape
    index = drafts[..., None]
    p_drafts, q_drafts = p[:, :n].gather(2, index)[..., 0], q.gather(2, index)[..., 0]
    u = torch.rand((b, n), generator=generator, device=drafts.device)
    accepted = _counted(u * q_drafts < p_drafts, limits)
    full = accepted == (limits if limits is not None else n)
    p_next = _at(p, accepted)
    residual = (p_next - _at(q, accepted.clamp(max=max(n - 1, 0)))).clamp_min(0) if n else p_next
    total = residual.sum(-1, keepdim=True)
    residual = torch.where(total > 0, residual / total, p_next)  # 0/0 where p_next is taken
    return accepted, sample(torch.where(full[:, None], p_next, residual), generator)
