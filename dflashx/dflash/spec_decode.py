"""Speculative decoding with a DFlash or DFlash2 drafter and its HF target, batch size 1 (the eval
stage's loop).

One cycle (DFlash, arXiv 2602.06036; verification as in Leviathan et al. 2023 / Chen et al. 2023):
  1. the drafter drafts a block [anchor = last accepted token, MASK x (B-1)] at positions
     start..start+B-1 from the target features of every position before the anchor (fewer rows
     at the end of generation, as the reference drafts them); DFlash2's path selector walks the
     block's rows (`dflashx.dflash.proposal`);
  2. the target verifies anchor + B-1 drafts in ONE cached forward, with hooks on the tapped decoder
     layers recording the features of those positions (the same layer outputs training captures);
  3. greedy: accept the longest prefix where draft == target argmax, plus the target's token after
     it (the bonus); sampling: accept draft x_i with probability min(1, p_i(x_i) / q_i(x_i)), on the
     first rejection sample from norm(max(0, p_i - q_i)), after a full accept sample the bonus from p
     (p: the target's serving distribution at T, top_p, top_k, `proposal.probs`; DFlash's q the
     drafter's, filtered alike; DFlash2's q is softmax(S / T) over its k candidates, zero elsewhere);
  4. the features of the anchor and the accepted drafts join the drafter's context (fused and
     projected to keys/values once: `DFlashDrafter.extend_context`); the target's cache is rolled
     back to the accepted length.

Cache rollback: attention layers (`DynamicLayer`) are cropped. A Gated DeltaNet (linear-attention)
layer holds a recurrent state that already absorbed all B verified tokens and cannot be cropped, so
its conv/recurrent states are snapshotted before verification; on a partial accept they are
restored, every attention layer is cropped back to the anchor, and the accepted tokens are run
through the target once more (one extra target forward per partially accepted cycle, hybrid
targets only). Sliding-window target layers are refused (their cache drops old keys).

Public API: `SpecDecoder(target, drafter)`, `.generate(prompt_ids, max_new_tokens, temperature=0.0,
stop_token_ids=(), generator=None, top_p=1.0, top_k=0) -> DecodeResult`;
`rejection_sample(draft_tokens, draft_probs, target_probs, generator) -> (accepted, next_token)`.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import (
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionCacheLayerMixin,
)

from dflashx.dflash.capture import find_decoder_layers
from dflashx.dflash.model import DFlashDrafter, DraftContext
from dflashx.dflash.proposal import Sampling, probs, propose, sample
from dflashx.dflash.verify import greedy_accept, rejection_accept


@dataclass
class DecodeResult:
    """One prompt's decoding: the generated ids and, per cycle, drafted and accepted counts."""

    output_ids: list[int]
    drafted: list[int] = field(default_factory=list)  # drafts verified in each cycle (B-1 but the last)
    accepted: list[int] = field(default_factory=list)  # drafts accepted in each cycle
    seconds: float = 0.0
    target_forwards: int = 0

    @property
    def decoded_after_first(self) -> int:
        """Tokens the draft-verify cycles produced: every output token but the prefill's first one
        (a cycle cut by a stop token or by max_new_tokens counts only what it kept)."""
        return max(0, len(self.output_ids) - 1)

    @property
    def tau(self) -> float:
        """Mean acceptance length as the reference DFlash loop counts it (`dflash` 0.1.0,
        `dflash_generate`'s acceptance_lengths): tokens decoded after the prefill's first token per
        draft-verify cycle."""
        return self.decoded_after_first / len(self.accepted) if self.accepted else 0.0


@contextmanager
def tapped(model: nn.Module, layer_ids: Sequence[int]) -> Iterator[dict[int, torch.Tensor]]:
    """Record the outputs of decoder layers `layer_ids` during forwards inside the block."""
    layers = find_decoder_layers(model)
    store: dict[int, torch.Tensor] = {}

    def hook(layer_id: int):
        def record(_module: nn.Module, _args: object, output: torch.Tensor | tuple[torch.Tensor, ...]) -> None:
            store[layer_id] = output[0] if isinstance(output, tuple) else output

        return record

    handles = [layers[i].register_forward_hook(hook(i)) for i in sorted(set(layer_ids))]
    try:
        yield store
    finally:
        for h in handles:
            h.remove()


def rejection_sample(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """Standard speculative sampling for one block (`verify.rejection_accept` of a batch of one).

    draft_tokens [n], draft_probs [n, V] (q), target_probs [n + 1, V] (p at the anchor and each draft).
    Returns (accepted drafts, the next token): the output is distributed exactly as sampling from p.
    """
    accepted, nxt = rejection_accept(draft_tokens[None], draft_probs[None], target_probs[None], generator=generator)
    return int(accepted[0]), int(nxt[0])


class _CacheRollback:
    """Return a target cache to an earlier length: crop attention, restore linear-attention state."""

    def __init__(self, cache: DynamicCache):
        if any(isinstance(layer, DynamicSlidingWindowLayer) for layer in cache.layers):
            raise NotImplementedError(
                "the target has sliding-window attention layers, whose cache drops old keys and cannot be "
                "rolled back exactly; speculative evaluation supports full-attention and Gated DeltaNet targets"
            )
        self.cache = cache
        self._saved: list[dict[str, dict]] = []

    @property
    def linear(self) -> list[LinearAttentionCacheLayerMixin]:
        return [layer for layer in self.cache.layers if isinstance(layer, LinearAttentionCacheLayerMixin)]

    @property
    def needs_replay(self) -> bool:
        return bool(self.linear)

    def snapshot(self) -> None:
        def clone(states: dict[int, torch.Tensor | None]) -> dict[int, torch.Tensor | None]:
            return {i: None if t is None else t.clone() for i, t in states.items()}

        self._saved = [
            {"conv": clone(layer.conv_states), "rec": clone(layer.recurrent_states),
             "prev": dict(layer.has_previous_state)}
            for layer in self.linear
        ]

    def restore(self) -> None:
        for layer, saved in zip(self.linear, self._saved):
            layer.conv_states.update(saved["conv"])
            layer.recurrent_states.update(saved["rec"])
            layer.has_previous_state.update(saved["prev"])

    def crop_attention(self, remove: int) -> None:
        if remove <= 0:
            return
        for layer in self.cache.layers:
            if isinstance(layer, DynamicLayer):
                DynamicLayer.crop(layer, -remove)


class SpecDecoder:
    """Greedy or sampled speculative decoding of one prompt at a time."""

    def __init__(self, target: PreTrainedModel, drafter: DFlashDrafter):
        self.target = target.eval()
        self.drafter = drafter.eval()
        self.cfg = drafter.config
        self.layer_ids = list(self.cfg.target_layer_ids)
        self.device = next(target.parameters()).device
        self.embed = target.get_input_embeddings()
        self.head = target.get_output_embeddings()
        # recent transformers name the cache argument `cache`, earlier 5.x releases `past_key_values`
        params = inspect.signature(target.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden.to(self.head.weight.dtype))

    def _forward(self, ids: list[int], start: int, cache: DynamicCache, keep_all: bool = True):
        """Cached target forward of `ids` at positions start..; returns (logits [L, V], features [1, L, k*H])."""
        x = torch.tensor([ids], device=self.device)
        pos = torch.arange(start, start + len(ids), device=self.device)[None]
        with tapped(self.target, self.layer_ids) as store:
            out = self.target(
                input_ids=x, position_ids=pos, use_cache=True, logits_to_keep=0 if keep_all else 1,
                **{self.cache_kw: cache},
            )
        feats = torch.cat([store[i] for i in self.layer_ids], dim=-1)
        return out.logits[0].float(), feats

    def _draft(self, context: DraftContext, anchor: int, n: int, sampling: Sampling, generator):
        """n drafted tokens after `anchor` and their proposal distributions (None when greedy)."""
        return propose(self.drafter, context, anchor, n, self.embed, self.lm_head, sampling.temperature,
                       generator, sampling.top_p, sampling.top_k)

    @staticmethod
    def _verify(drafts: torch.Tensor, q: torch.Tensor | None, logits: torch.Tensor, sampling: Sampling, generator):
        """(accepted drafts, next token) from the target's logits over anchor + drafts."""
        if sampling.temperature <= 0:
            accepted, nxt = greedy_accept(drafts[None], logits[None])
            return int(accepted[0]), int(nxt[0])
        assert q is not None  # a sampled proposal always has its distributions
        return rejection_sample(drafts, q.to(logits.device), probs(logits, *sampling), generator)

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        temperature: float = 0.0,
        stop_token_ids: Iterable[int] = (),
        generator: torch.Generator | None = None,
        top_p: float = 1.0,
        top_k: int = 0,
    ) -> DecodeResult:
        """Decode up to `max_new_tokens` after `prompt_ids` (stopping after a stop token): greedy at
        temperature 0, else sampled from the target's distribution at (temperature, top_p, top_k)."""
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        sampling = Sampling(temperature, top_p, top_k)
        stops, block = set(stop_token_ids), self.cfg.block_size
        t0 = time.perf_counter()
        cache = DynamicCache(config=self.target.config)
        rollback = _CacheRollback(cache)
        logits, prompt_feats = self._forward(list(prompt_ids), 0, cache, keep_all=False)
        context = self.drafter.extend_context(None, prompt_feats)
        first = (int(logits[-1].argmax()) if temperature <= 0
                 else int(sample(probs(logits[-1], *sampling), generator)))
        result = DecodeResult(output_ids=[first], target_forwards=1)
        start = len(prompt_ids)  # position of the anchor (the last token, not yet in the target cache)
        while len(result.output_ids) < max_new_tokens and result.output_ids[-1] not in stops:
            # every draft that can still become an output token is drafted and verified (the last of them,
            # accepted, discards the bonus: the output is trimmed below), as the reference does
            n = min(block - 1, max_new_tokens - len(result.output_ids))
            anchor = result.output_ids[-1]
            drafts, q = self._draft(context, anchor, n, sampling, generator)
            if rollback.needs_replay:
                rollback.snapshot()
            logits, feats = self._forward([anchor, *drafts.tolist()], start, cache)
            result.target_forwards += 1
            accepted, nxt = self._verify(drafts.to(logits.device), q, logits, sampling, generator)
            keep = accepted + 1  # the anchor and the accepted drafts enter the cache and the context
            if keep < n + 1 and rollback.needs_replay:
                rollback.restore()
                rollback.crop_attention(n + 1)
                self._forward([anchor, *drafts[:accepted].tolist()], start, cache, keep_all=False)
                result.target_forwards += 1
            elif keep < n + 1:
                rollback.crop_attention(n + 1 - keep)
            context = self.drafter.extend_context(context, feats[:, :keep])
            start += keep
            result.drafted.append(n)
            result.accepted.append(accepted)
            new = [*drafts[:accepted].tolist(), nxt]
            stop_at = next((i for i, tok in enumerate(new) if tok in stops), len(new) - 1)
            result.output_ids.extend(new[: stop_at + 1])
        del result.output_ids[max_new_tokens:]
        result.seconds = time.perf_counter() - t0
        return result
