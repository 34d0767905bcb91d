"""Speculative decoding of many prompts at once with a DFlash or DFlash2 drafter and its HF target: the eval
stage's and the held-out τ probe's decoder (`SpecDecoder`, batch size 1, is the reference-matched loop).

Each row of the batch is one prompt and runs `SpecDecoder.generate`'s cycle (module doc of
`dflashx.dflash.spec_decode`): the drafter drafts a block for every row in one forward
(`proposal.propose_rows`), the target verifies every row's block in one forward, each row accepts as many
drafts as its own verification gives (`verify.greedy_accept` / `verify.rejection_accept`), and the rows
go on from there. What differs between rows is handled by where their entries sit, not by padding:

- prompts are right-padded; row i's tokens sit at slots = positions 0.. of the target's cache and of the
  drafter's context (`row_cache`), and each forward writes row i's block at its own length starts[i];
  its queries see the slots up to their position (a 4D mask the target's sdpa or eager attention takes as it
  is) and the drafter's block sees the first starts[i] context slots (`DraftMask` anchored at starts[i]);
- a row that accepts k drafts moves its length on by k + 1: its rejected drafts' entries lie past its length,
  unseen, and its next block overwrites them (no crop);
- near `max_new_tokens` a row drafts only what can still become output (n = min(B - 1, left)): the block is
  as wide as the widest row needs, and a row's slots past its own n are invisible to its drafted rows and
  never accepted, so it drafts and counts exactly what it would alone;
- a row that ends (stop token, `max_new_tokens`) leaves the batch: every buffer keeps only the live rows
  (`compact=False` keeps it, drafting nothing, for comparison).

Greedy, every row's output and per-cycle counts are those of `SpecDecoder.generate` on its prompt (the same
arithmetic up to batched kernels' rounding: tested token for token and cycle for cycle); `DecodeResult`s
are counted alike (drafted n per cycle, accepted, the output trimmed after a stop token and at
`max_new_tokens`), so `dflashx.dflash.acceptance` summarizes them unchanged. A row's `seconds` is the
batch's wall time divided by its rows (their sum is the wall time). Sampled, each row is decoded by
rejection sampling from one generator in batch order: the law of every row's output and τ is
`SpecDecoder`'s (the target's own sampling law, Leviathan et al. 2023), its draws are not (SpecDecoder
draws one prompt after another, as the z-lab reference does: the reference tests use it).

Not batched (decoded one prompt at a time by `SpecDecoder`, the same results): targets with linear-attention
(Gated DeltaNet) layers, qwen3_5 hybrids, whose recurrent state cannot go back per row; attention other than
sdpa or eager (flash attention takes no 4D mask). Sliding-window targets are refused by `SpecDecoder`.

Prompts decode `max_rows` at a time (default `batch_rows`: every prompt on a CPU; on a GPU as many as half
the free memory holds at their full length); the prefill runs at most `PREFILL_TOKENS` padded tokens a
forward. One host read per cycle (the accepted counts and tokens, which decide what each row does next).

Public API: `BatchDecoder(target, drafter, max_rows=None, compact=True)` with `.batched`, `.reason`, `.cycles`
(the draft-verify cycles the last `generate` ran: what a launch-bound GPU decode's time follows) and
`.generate(prompts, max_new_tokens, temperature=0.0, stop_token_ids=(), generator=None, top_p=1.0, top_k=0)
-> list[DecodeResult]`; `unbatchable(target) -> str | None`; `batch_rows(target, drafter, prompts,
max_new_tokens) -> int`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from dflashx.dflash.capture import find_decoder_layers
from dflashx.dflash.model import DFlashDrafter
from dflashx.dflash.proposal import Sampling, probs, propose_rows, sample
from dflashx.dflash.row_cache import RowCache, RowKV, row_causal_mask
from dflashx.dflash.spec_decode import DecodeResult, SpecDecoder, tapped
from dflashx.dflash.verify import greedy_accept, rejection_accept

PREFILL_TOKENS = 8192  # padded prompt tokens per prefill forward (bounds its activations)
MEMORY_SHARE = 0.5  # of the GPU's free memory the batch's caches and logits may take (`batch_rows`)


def unbatchable(target: PreTrainedModel) -> str | None:
    """Why `target` cannot be decoded as a batch (None: it can)."""
    attention = getattr(target.config, "_attn_implementation", None)
    if attention not in ("sdpa", "eager"):
        return f"its {attention} attention takes no per-row 4D mask"
    layers = DynamicCache(config=target.config).layers
    if any(type(layer) is not DynamicLayer for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers} - {"DynamicLayer"})
        return f"its cache has {', '.join(kinds)} layers, which cannot be rolled back per row"
    return None


def _kv_bytes_per_token(config, element: int) -> int:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return 2 * text.num_hidden_layers * heads * head_dim * element


def batch_rows(target: PreTrainedModel, drafter: DFlashDrafter, prompts: Sequence[Sequence[int]],
               max_new_tokens: int) -> int:
    """Prompts decoded at once: all on a CPU; on a GPU as many as `MEMORY_SHARE` of its free memory holds, each
    at the longest prompt's full length (target cache and drafter context) plus a block's logits, several
    times over (probabilities, the draft distributions, their sort)."""
    device = next(target.parameters()).device
    if device.type != "cuda" or not prompts:
        return max(1, len(prompts))
    cfg = drafter.config
    slots = max(map(len, prompts)) + max_new_tokens + cfg.block_size
    element = next(target.parameters()).element_size()
    drafter_kv = 2 * cfg.num_layers * cfg.num_key_value_heads * cfg.head_dim * element
    logits = 8 * cfg.block_size * cfg.vocab_size * 4  # fp32 [B, V] several times over
    per_row = (_kv_bytes_per_token(target.config, element) + drafter_kv) * slots + logits
    free, _total = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)  # cached by torch, reusable
    return max(1, min(len(prompts), int(MEMORY_SHARE * free // per_row)))


@contextmanager
def _last_rows(head: nn.Module, index: torch.Tensor | None) -> Iterator[None]:
    """While inside, the LM head sees only position index[i] of row i (the prefill's last prompt token)."""
    if index is None:
        yield
        return

    def gather(_module: nn.Module, args: tuple) -> tuple:
        hidden = args[0]
        return (hidden.gather(1, index[:, None, None].expand(-1, 1, hidden.shape[-1])), *args[1:])

    handle = head.register_forward_pre_hook(gather)
    try:
        yield
    finally:
        handle.remove()


class BatchDecoder:
    """Greedy or sampled speculative decoding of many prompts at once (module doc)."""

    def __init__(self, target: PreTrainedModel, drafter: DFlashDrafter, max_rows: int | None = None,
                 compact: bool = True):
        self.single = SpecDecoder(target, drafter)  # the layers, head and embedding; the fallback
        self.target, self.drafter, self.cfg = self.single.target, self.single.drafter, self.single.cfg
        self.device, self.max_rows, self.compact = self.single.device, max_rows, compact
        self.cycles = 0  # the draft-verify cycles (target forwards after the prefills) the last `generate` ran
        self.reason = unbatchable(target)
        self.layers = len(find_decoder_layers(target))
        self.mask_dtype = next(self.single.embed.parameters()).dtype  # the attention's activations

    @property
    def batched(self) -> bool:
        return self.reason is None

    def forward(self, cache: RowCache, ids: torch.Tensor, offsets: torch.Tensor, length: int,
                rows: torch.Tensor | None = None, last: torch.Tensor | None = None):
        """Target forward of ids [r, q] written at slots offsets[i].. of batch rows `rows` (all when None),
        attending over `length` slots: (logits [r, q, V] fp32, or [r, 1, V] at `last` [r]; features [r, q, k*H])."""
        positions = offsets[:, None] + torch.arange(ids.shape[1], device=ids.device)
        cache.prepare(offsets, length, rows)
        mask = row_causal_mask(positions, length, self.mask_dtype)
        with tapped(self.target, self.single.layer_ids) as store, _last_rows(self.single.head, last):
            out = self.target(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True,
                              **{self.single.cache_kw: cache})
        return out.logits.float(), torch.cat([store[i] for i in self.single.layer_ids], dim=-1)

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float = 0.0,
        stop_token_ids: Iterable[int] = (),
        generator: torch.Generator | None = None,
        top_p: float = 1.0,
        top_k: int = 0,
    ) -> list[DecodeResult]:
        """`SpecDecoder.generate` of every prompt (module doc), in the prompts' order."""
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        stops = frozenset(stop_token_ids)
        if not self.batched:
            results = [self.single.generate(p, max_new_tokens, temperature, stops, generator, top_p, top_k)
                       for p in prompts]
            self.cycles = sum(len(r.accepted) for r in results)
            return results
        sampling = Sampling(temperature, top_p, top_k)
        rows = self.max_rows or batch_rows(self.target, self.drafter, prompts, max_new_tokens)
        results = []
        self.cycles = 0
        for lo in range(0, len(prompts), rows):
            batch = _Batch(self, prompts[lo : lo + rows], max_new_tokens, sampling, stops, generator)
            results.extend(batch.run())
            self.cycles += batch.cycles
        return results


class _Batch:
    """One batch's decoding: the rows' results, their lengths and anchors, the target cache and drafter context."""

    def __init__(self, dec: BatchDecoder, prompts: Sequence[Sequence[int]], max_new_tokens: int, sampling: Sampling,
                 stops: frozenset[int], generator: torch.Generator | None):
        self.dec, self.prompts, self.max_new, self.sampling = dec, [list(p) for p in prompts], max_new_tokens, sampling
        self.stops, self.generator, self.block = stops, generator, dec.cfg.block_size
        capacity = max(map(len, self.prompts)) + max_new_tokens + self.block
        batch = len(self.prompts)
        self.cache = RowCache(dec.layers, batch, capacity)
        self.context = [RowKV(batch, capacity) for _ in range(dec.cfg.num_layers)]
        self.results = [DecodeResult(output_ids=[], target_forwards=1) for _ in self.prompts]
        self.live = list(range(batch))  # the result each batch row decodes
        self.starts = [len(p) for p in self.prompts]  # each row's length: the position of its anchor
        self.cycles = 0  # draft-verify cycles run

    def _first(self, logits: torch.Tensor) -> torch.Tensor:
        if self.sampling.temperature <= 0:
            return logits.argmax(-1)
        return sample(probs(logits, *self.sampling), self.generator)

    def prefill(self) -> None:
        """Every prompt through the target (at most PREFILL_TOKENS padded tokens a forward), its features into
        the drafter's context, its first token from the last prompt position's logits."""
        device, lengths = self.dec.device, [len(p) for p in self.prompts]
        step = max(1, PREFILL_TOKENS // max(lengths))
        firsts = []
        for lo in range(0, len(self.prompts), step):
            group = range(lo, min(lo + step, len(self.prompts)))
            width = max(lengths[i] for i in group)
            ids = torch.tensor([self.prompts[i] + [self.prompts[i][-1]] * (width - lengths[i]) for i in group],
                               device=device)
            rows = None if len(group) == len(self.prompts) else torch.tensor(list(group), device=device)
            zeros = torch.zeros(len(group), dtype=torch.long, device=device)
            last = torch.tensor([lengths[i] - 1 for i in group], device=device)
            logits, feats = self.dec.forward(self.cache, ids, zeros, width, rows, last)
            positions = torch.arange(width, device=device).expand(len(group), -1)
            for store, (k, v) in zip(self.context, self.dec.drafter.project_context(feats, positions)):
                store.write(k, v, zeros, rows, width)
            firsts.append(self._first(logits[:, 0]))
        for result, token in zip(self.results, torch.cat(firsts).tolist()):
            result.output_ids.append(token)

    def _done(self, row: int) -> bool:
        out = self.results[self.live[row]].output_ids
        return len(out) >= self.max_new or out[-1] in self.stops

    def cycle(self) -> None:
        """One draft-verify cycle of every live row (module doc)."""
        dec, device = self.dec, self.dec.device
        done = [self._done(j) for j in range(len(self.live))]
        drafted = [0 if d else min(self.block - 1, self.max_new - len(self.results[i].output_ids))
                   for i, d in zip(self.live, done)]
        width, context = max(drafted) + 1, max(self.starts)
        anchors = [self.results[i].output_ids[-1] for i in self.live]
        starts, anchor, used = torch.tensor([self.starts, anchors, [n + 1 for n in drafted]], device=device).unbind(0)
        kv = [store.read(context) for store in self.context]
        drafts, q = propose_rows(dec.drafter, kv, starts, anchor, width, used, dec.single.embed,
                                 dec.single.lm_head, self.sampling, self.generator)
        logits, feats = dec.forward(self.cache, torch.cat([anchor[:, None], drafts], dim=1), starts, context + width)
        if self.sampling.temperature <= 0:
            accepted, nxt = greedy_accept(drafts, logits, used - 1)
        else:
            assert q is not None  # a sampled proposal always has its distributions
            accepted, nxt = rejection_accept(drafts, q, probs(logits, *self.sampling), used - 1, self.generator)
        positions = starts[:, None] + torch.arange(width, device=device)
        for store, (k, v) in zip(self.context, dec.drafter.project_context(feats, positions)):
            store.write(k, v, starts, end=context + width)
        for j, row in enumerate(torch.cat([accepted[:, None], nxt[:, None], drafts], dim=1).tolist()):
            if not done[j]:
                self._advance(j, drafted[j], row[0], row[1], row[2:])

    def _advance(self, row: int, drafted: int, accepted: int, nxt: int, drafts: list[int]) -> None:
        """Row `row`'s cycle counted as `SpecDecoder.generate` counts it; its length moves past what it kept."""
        result = self.results[self.live[row]]
        result.drafted.append(drafted)
        result.accepted.append(accepted)
        result.target_forwards += 1
        new = [*drafts[:accepted], nxt]
        stop_at = next((i for i, tok in enumerate(new) if tok in self.stops), len(new) - 1)
        result.output_ids.extend(new[: stop_at + 1])
        self.starts[row] += accepted + 1

    def _drop_finished(self) -> None:
        keep = [j for j in range(len(self.live)) if not self._done(j)]
        if len(keep) == len(self.live) or not keep:
            return
        index = torch.tensor(keep, device=self.dec.device)
        self.cache.select(index)
        for store in self.context:
            store.select(index)
        self.live, self.starts = [self.live[j] for j in keep], [self.starts[j] for j in keep]

    def run(self) -> list[DecodeResult]:
        t0 = time.perf_counter()
        self.prefill()
        while not all(self._done(j) for j in range(len(self.live))):
            if self.dec.compact:
                self._drop_finished()
            self.cycle()
            self.cycles += 1
        seconds = time.perf_counter() - t0
        for result in self.results:
            del result.output_ids[self.max_new :]
            result.seconds = seconds / len(self.results)
        return self.results
