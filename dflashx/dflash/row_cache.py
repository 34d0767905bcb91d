"""Keys and values of many sequences that grow by different amounts: the batched decoder's target cache and
drafter context (`dflashx.dflash.batch_decode`).

Layout: row i of the batch keeps its entries at slots 0.. of its own row, slot = the token's position (no
padding in front: prompts are right-padded). Each forward writes its q new entries of row i at slots
offsets[i] .. offsets[i] + q - 1 and attends over slots 0 .. max(offsets) + q - 1; a query at position t sees
the slots <= t of its row (`row_causal_mask`). Slots past a row's length hold what an earlier forward wrote
there (a rejected draft, another row's longer block, a prompt's padding): nothing sees them, and the next
block of that row overwrites them. So rolling a row back to length n is setting its offset to n: no crop, no
copy. Buffers start zeroed (stale slots are finite: a masked NaN would still poison a softmax through the
values) and grow by doubling, up to a known capacity.

`RowCache` is a transformers `Cache` whose layers are `RowLayer`s: the target's attention layers call
`update(keys, values, layer_idx)` as with their own caches; the decoder sets the rows, offsets and length of
the next forward with `RowCache.prepare` and passes `row_causal_mask` as a 4D attention mask (transformers
uses a 4D mask as it is, for sdpa and eager attention). Only full-attention layers can be held this way: a
linear-attention state has absorbed every token it saw (hybrid targets decode one prompt at a time).

Public API: `RowKV` (one layer's buffers: `write(k, v, offsets, rows=None)`, `read(length, rows=None)`,
`select(keep)`), `RowCache(layers, capacity)` with `.prepare(offsets, length, rows=None)` and `.select(keep)`,
`row_causal_mask(positions [r, q], length, dtype) -> [r, 1, q, length]`.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

GROWTH = 256  # slots a fresh buffer holds beyond its first write


class RowKV:
    """One layer's keys and values [b, heads, slots, d] of every row, written at per-row offsets."""

    def __init__(self, batch: int, capacity: int):
        self.batch, self.capacity = batch, capacity
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def _reserve(self, like_k: torch.Tensor, like_v: torch.Tensor, slots: int) -> None:
        have = 0 if self.keys is None else self.keys.shape[2]
        if slots <= have:
            return
        size = min(max(slots, 2 * have, have + GROWTH), max(self.capacity, slots))

        def grown(old: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
            new = like.new_zeros(self.batch, like.shape[1], size, like.shape[3])
            if old is not None:
                new[:, :, :have] = old
            return new

        self.keys, self.values = grown(self.keys, like_k), grown(self.values, like_v)

    def write(self, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor, rows: torch.Tensor | None = None,
              end: int | None = None) -> None:
        """Write k, v [r, heads, q, d] of batch rows `rows` (all when None) at slots offsets[i] + 0..q-1
        (offsets [r]); `end`: max(offsets) + q when the caller knows it (no device read)."""
        q = k.shape[2]
        self._reserve(k, v, end if end is not None else int(offsets.max()) + q)
        assert self.keys is not None and self.values is not None
        index = rows if rows is not None else torch.arange(k.shape[0], device=k.device)
        slots = offsets[:, None] + torch.arange(q, device=k.device)
        heads = torch.arange(k.shape[1], device=k.device)
        where = (index[:, None, None], heads[None, :, None], slots[:, None, :])
        self.keys[where] = k.to(self.keys.dtype)
        self.values[where] = v.to(self.values.dtype)

    def read(self, length: int, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots 0..length-1 of batch rows `rows` (all, as views, when None)."""
        assert self.keys is not None and self.values is not None
        if rows is None:
            return self.keys[:, :, :length], self.values[:, :, :length]
        return self.keys[rows, :, :length], self.values[rows, :, :length]

    def select(self, keep: torch.Tensor) -> None:
        """Keep batch rows `keep` (in that order) and drop the others."""
        self.batch = int(keep.shape[0])
        if self.keys is not None and self.values is not None:
            self.keys, self.values = self.keys[keep], self.values[keep]


class _Next:
    """What the next forward writes: its batch rows (None: all), their offsets [r] and the length attended."""

    def __init__(self) -> None:
        self.rows: torch.Tensor | None = None
        self.offsets: torch.Tensor | None = None
        self.length = 0


class RowLayer(CacheLayerMixin):
    """One attention layer's `RowKV` behind transformers' cache-layer interface."""

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self, store: RowKV, nxt: _Next):
        super().__init__()
        self.store, self.next = store, nxt

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self.next.offsets is not None, "RowCache.prepare before each forward"
        self.store.write(key_states, value_states, self.next.offsets, self.next.rows, self.next.length)
        return self.store.read(self.next.length, self.next.rows)

    def get_mask_sizes(self, query_length: int, *args, **kwargs) -> tuple[int, int]:
        return self.next.length, 0

    def get_seq_length(self, *args, **kwargs) -> int:
        return max(self.next.length - 1, 0)

    def get_max_length(self) -> int:
        return -1


class RowCache(Cache):
    """A target cache of `layers` attention layers for a batch of rows (module doc)."""

    def __init__(self, layers: int, batch: int, capacity: int):
        self.next = _Next()
        self.stores = [RowKV(batch, capacity) for _ in range(layers)]
        super().__init__(layers=[RowLayer(store, self.next) for store in self.stores])

    def prepare(self, offsets: torch.Tensor, length: int, rows: torch.Tensor | None = None) -> None:
        """The next forward writes rows `rows` (all when None) at `offsets` [r] and attends over `length` slots."""
        self.next.offsets, self.next.length, self.next.rows = offsets, length, rows

    def select(self, keep: torch.Tensor) -> None:
        for store in self.stores:
            store.select(keep)


def row_causal_mask(positions: torch.Tensor, length: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive 4D mask [r, 1, q, length]: the query at positions[i, j] sees slots <= positions[i, j] of its row
    (0 where it sees, the dtype's lowest value elsewhere: what sdpa and eager attention both add)."""
    slots = torch.arange(length, device=positions.device)
    visible = slots[None, None, :] <= positions[:, :, None]
    mask = torch.zeros(visible.shape, dtype=dtype, device=positions.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[:, None]
