"""Attention masks for drafting many blocks of one sequence in a single drafter pass.

Layout of one drafter layer's attention (per sample of the batch):
  queries: the n blocks' tokens, block i slot s at query index i * B + s (position anchor_i + s);
  keys:    [T context features ; the same n * B block tokens], context key p at position p.

Rules (DFlash, arXiv 2602.06036; z-lab `dflash` inference code):
  - query (i, s) sees context key p only when p < anchor_i (strictly: the anchor's own features
    are not known when it is drafted);
  - it sees every slot of its own block (bidirectional), or slots t <= s in a causal layer;
  - it never sees another block, even when blocks overlap in positions (limits are per anchor,
    not per block index or per position);
  - in a sliding-window layer, also (query position - key position) < window (and the reverse
    distance for bidirectional in-block keys), as the reference computes it.
Padded anchors (anchor = -1) see only their own block, so no row is empty.
Decoding many prompts at once (`dflashx.dflash.batch_decode`) gives each batch row its own anchor (its own
context length) and, optionally, its own number of block slots in use (`rows`): in-block keys at slots
>= rows[b] are invisible, so a block cut short at the end of generation drafts exactly what a block of
that many rows drafts on its own.

One predicate (`mask_mod`) serves both back-ends: torch flex attention (`create_block_mask`,
no head dimension) on CUDA, and a dense boolean mask for SDPA elsewhere (flex attention without
torch.compile materialises the scores anyway).

Public API: `DraftMask(anchors, context_len, block_size, backend="auto", rows=None)` (built per batch;
`.for_layer(causal, window)` gives the mask object for one layer kind) and `attend(q, k, v, mask, scale)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def make_mask_mod(
    anchors: torch.Tensor, context_len: int, block_size: int, causal: bool, window: int | None,
    rows: torch.Tensor | None = None,
) -> MaskMod:
    """The visibility predicate `(b, h, q_idx, kv_idx) -> bool` for anchors [batch, n] (and, when given,
    the block slots in use per batch row, rows [batch]). The context
    length is held as a tensor, not a Python int: compiled code guards on the ints a mask function
    closes over, so an int would recompile the drafter's layers for every new sequence length."""
    context = torch.tensor(context_len, device=anchors.device)

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        block = q_idx // block_size
        slot = q_idx % block_size
        anchor = anchors[b, block]
        is_ctx = kv_idx < context
        rel = kv_idx - context
        key_slot = rel % block_size
        in_block = (rel // block_size == block) & ~is_ctx
        if causal:
            in_block = in_block & (key_slot <= slot)
        if rows is not None:
            in_block = in_block & (key_slot < rows[b])
        visible = (is_ctx & (kv_idx < anchor)) | in_block
        if window is not None:
            distance = torch.where(is_ctx, anchor + slot - kv_idx, slot - key_slot)
            near = distance < window
            if not causal:
                near = near & (-distance < window)
            visible = visible & near
        return visible

    return mask_mod


def dense_mask(mod: MaskMod, batch: int, q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """Evaluate the predicate on the full grid: bool [batch, 1, q_len, kv_len]."""
    b = torch.arange(batch, device=device)[:, None, None]
    q = torch.arange(q_len, device=device)[None, :, None]
    kv = torch.arange(kv_len, device=device)[None, None, :]
    h = torch.zeros((), dtype=torch.long, device=device)
    return mod(b, h, q, kv)[:, None]


@dataclass
class DraftMask:
    """Masks for one batch: anchors [batch, n] (-1 = padding), T context keys, block size B."""

    anchors: torch.Tensor
    context_len: int
    block_size: int
    backend: str = "auto"  # "flex" | "sdpa" | "auto" (flex on CUDA)
    rows: torch.Tensor | None = None  # block slots in use per batch row [batch] (None: all)
    _cache: dict[tuple[bool, int | None], Any] = field(default_factory=dict, repr=False)

    @property
    def q_len(self) -> int:
        return self.anchors.shape[1] * self.block_size

    @property
    def kv_len(self) -> int:
        return self.context_len + self.q_len

    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "flex" if self.anchors.is_cuda else "sdpa"

    def for_layer(self, causal: bool, window: int | None) -> Any:
        """A flex `BlockMask` or a dense bool mask for a layer of this kind (cached)."""
        key = (causal, window)
        if key not in self._cache:
            mod = make_mask_mod(self.anchors, self.context_len, self.block_size, causal, window, self.rows)
            batch, device = self.anchors.shape[0], self.anchors.device
            if self.resolved_backend() == "flex":
                from torch.nn.attention.flex_attention import create_block_mask

                self._cache[key] = create_block_mask(mod, batch, None, self.q_len, self.kv_len, device=device)
            else:
                self._cache[key] = dense_mask(mod, batch, self.q_len, self.kv_len, device)
        return self._cache[key]


_compiled_flex: Callable[..., torch.Tensor] | None = None


def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any, scale: float) -> torch.Tensor:
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if not q.is_cuda:
        return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention)
    return _compiled_flex(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, scale: float) -> torch.Tensor:
    """Attention with q [b, Hq, Lq, d], k/v [b, Hkv, Lk, d] (GQA) under a `DraftMask.for_layer` mask."""
    if isinstance(mask, torch.Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return _flex(q, k, v, mask, scale)
