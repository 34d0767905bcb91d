"""DFlash2's two modules on the DFlash backbone (Z Lab and Inco AI, 2026-08-18).

Facts from the reference (PyPI `dflash` 0.1.0, `dflash/model.py`) and the engines' loaders (SGLang
PR #35371, vLLM PR #52816); parameter names are the published checkpoints':

- `GroupedDynamicConv` (`layers.N.attention_conv`, `layers.N.mlp_conv`): around a sublayer, on the
  block's rows. `base_kernel` [2, K, H] (side 0 before the sublayer, side 1 after it) and
  `kernel_projection` Linear(H -> 2*K*G), G = H / group (no bias, no activation), applied once to
  the normalised sublayer input to give both sides' dynamic kernels:
      out[t, c] = sum_o (base[side, o, c] + d[t, side, o, c // group]) * x[t - o, c],
  where x[t - o] is zero before the block's first row (the anchor): a tap never crosses a block.
  Initialised to the identity (base tap 0 = 1, other taps 0, projection 0), as the trainers start.
- `PathSelector` (`candidate_selector`): codebooks A (`predecessor_codebook`) and B
  (`successor_codebook`), V x r each, and `hidden_projection` Linear(H -> r, no bias). At each block
  position t the candidates are the top-k of the unary logits U_t, scored
      S_t(a, b) = U_t(b) + <A[a] * P(h_t), B[b]>
  for predecessor a. Decoding walks left to right from the anchor, greedily or sampling softmax(S/T)
  over the k candidates (that distribution is the draft distribution q of rejection sampling).
  The successor codebook starts at zero (SpecForge, NeMo): the untrained selector picks the top-1.

This module is DFlash2's torch half (`dflashx.dflash.architecture`, named by its registry entry
`dflashx.config.architectures.dflash2`): its modules on every layer and on the drafter, the sublayers inside the
convolutions, the selector's loss term beside the backbone's (`selector_loss`) and its proposal, the walk.

Public API: `GroupedDynamicConv(hidden, kernel, group)` with `.prepare(x, block_size) -> (y,
dynamic)` and `.finish(y, dynamic, block_size)`; `PathSelector(hidden, vocab, rank, top_k)` with
`.pair_scores(hidden [N, H], predecessor [N], candidates [N, k]) -> [N, k]`, `.walk(hidden [L, H],
logits [L, V], anchor_id, temperature, generator) -> (tokens [L], q [L, V] | None)` and `.walk_rows` (the
same for b blocks at once: hidden [b, L, H], logits [b, L, V], anchor ids [b]).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from dflashx.config.architectures.dflash2 import SPEC, DFlash2Keys
from dflashx.dflash.selector_loss import SelectorOutput, selector_loss, teacher_predecessors

if TYPE_CHECKING:
    from dflashx.dflash.architecture import Head, Proposal
    from dflashx.dflash.config import DFlashConfig
    from dflashx.dflash.loss import LossOutput


def _convolve(x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor, group: int) -> torch.Tensor:
    """x [b, n, B, H] (n blocks of B rows), dynamic [b, n, B, K, G], base [K, H] -> [b, n, B, H]."""
    *lead, rows, hidden = x.shape
    groups = hidden // group
    out = torch.zeros_like(x)
    for o in range(base.shape[0]):
        shifted = x if o == 0 else F.pad(x[..., : rows - o, :], (0, 0, o, 0))  # zeros before the block start
        out = out + shifted * base[o].to(x.dtype)
        grouped = shifted.view(*lead, rows, groups, group) * dynamic[..., o, :, None].to(x.dtype)
        out = out + grouped.view_as(x)
    return out


class GroupedDynamicConv(nn.Module):
    """One DFlash2 convolution module (see the module doc)."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        if hidden_size % group_size:
            raise ValueError(f"conv_group_size {group_size} does not divide the hidden size {hidden_size}")
        self.kernel_size, self.group_size = kernel_size, group_size
        self.groups = hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The identity: base tap 0 = 1, the other taps 0, the projection 0."""
        with torch.no_grad():
            self.base_kernel.zero_()
            self.base_kernel[:, 0] = 1.0
            self.kernel_projection.weight.zero_()

    def _blocks(self, x: torch.Tensor, block_size: int) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1] // block_size, block_size, x.shape[-1])

    def prepare(self, x: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The normalised sublayer input x [b, n*B, H] convolved by side 0, and side 1's dynamic kernels."""
        blocks = self._blocks(x, block_size)
        dynamic = self.kernel_projection(blocks).view(*blocks.shape[:-1], 2, self.kernel_size, self.groups)
        return _convolve(blocks, dynamic[..., 0, :, :], self.base_kernel[0], self.group_size).view_as(x), \
            dynamic[..., 1, :, :]

    def finish(self, y: torch.Tensor, dynamic: torch.Tensor, block_size: int) -> torch.Tensor:
        """The sublayer's output y [b, n*B, H] convolved by side 1."""
        return _convolve(self._blocks(y, block_size), dynamic, self.base_kernel[1], self.group_size).view_as(y)


class PathSelector(nn.Module):
    """DFlash2's pairwise path selector (see the module doc)."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Embedding(vocab_size, rank)
        self.successor_codebook = nn.Embedding(vocab_size, rank)
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        """Normal(0, std) predecessor codebook and projection; the successor codebook at zero."""
        nn.init.normal_(self.predecessor_codebook.weight, std=std)
        nn.init.normal_(self.hidden_projection.weight, std=std)
        nn.init.zeros_(self.successor_codebook.weight)

    def pair_scores(self, hidden: torch.Tensor, predecessor: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """<A[a] * P(h), B[b]> [N, k] for hidden [N, H], predecessors a [N] and candidates b [N, k]."""
        query = self.predecessor_codebook(predecessor) * self.hidden_projection(hidden.to(self.hidden_projection
                                                                                          .weight.dtype))
        return torch.einsum("nr,nkr->nk", query, self.successor_codebook(candidates))

    @torch.no_grad()
    def walk(self, hidden: torch.Tensor, logits: torch.Tensor, anchor_id: int, temperature: float = 0.0,
             generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The drafted path [L] for block rows hidden [L, H] with unary logits [L, V], left to right from
        the anchor: the best candidate (temperature <= 0) or one sampled from softmax(S / T); when
        sampling, also q [L, V], each row's draft distribution (zero outside its candidates)."""
        anchor = torch.tensor([anchor_id], device=logits.device)
        path, q = self.walk_rows(hidden[None], logits[None], anchor, temperature, generator)
        return path[0], None if q is None else q[0]

    @torch.no_grad()
    def walk_rows(self, hidden: torch.Tensor, logits: torch.Tensor, anchor_ids: torch.Tensor, temperature: float = 0.0,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`walk` for b blocks at once: hidden [b, L, H], logits [b, L, V], anchors [b] -> paths [b, L] and,
        when sampling, q [b, L, V]; at each step one draw per block (row 0 first), as `walk` draws for one."""
        unary, candidates = torch.topk(logits.float(), self.top_k, dim=-1, sorted=False)  # as the reference
        predecessor = anchor_ids
        tokens, q_rows = [], []
        for t in range(logits.shape[1]):
            scores = unary[:, t] + self.pair_scores(hidden[:, t], predecessor, candidates[:, t]).float()
            if temperature > 0:
                q = torch.softmax(scores / temperature, dim=-1)
                index = torch.multinomial(q, 1, generator=generator)
                q_rows.append(torch.zeros_like(logits[:, t], dtype=torch.float32).scatter(1, candidates[:, t], q))
            else:
                index = scores.argmax(-1, keepdim=True)
            predecessor = candidates[:, t].gather(1, index)[:, 0]
            tokens.append(predecessor)
        path = torch.stack(tokens, dim=1) if tokens else candidates.new_zeros(candidates.shape[0], 0)
        return path, (torch.stack(q_rows, dim=1) if q_rows else None)


# parameters stored under another name than the module's: the selector's codebooks (the published checkpoints')
FILE_NAMES = {f"candidate_selector.{book}.weight": f"candidate_selector.{book}"
              for book in ("predecessor_codebook", "successor_codebook")}


def _keys(config: DFlashConfig) -> DFlash2Keys:
    keys: DFlash2Keys = SPEC.keys_of(config)
    return keys


def layer_modules(config: DFlashConfig) -> dict[str, nn.Module]:
    keys = _keys(config)
    return {side: GroupedDynamicConv(config.hidden_size, keys.conv_kernel_size, keys.conv_group_size)
            for side in ("attention_conv", "mlp_conv")}


def drafter_modules(config: DFlashConfig) -> dict[str, nn.Module]:
    keys = _keys(config)
    return {"candidate_selector": PathSelector(config.hidden_size, config.vocab_size, keys.selector_rank,
                                               keys.selector_top_k)}


def around(layer: Any, side: str, sublayer: Head, x: torch.Tensor) -> torch.Tensor:
    """norm -> conv side 0 -> sublayer -> conv side 1, on the layer's `{side}_conv`."""
    conv = getattr(layer, f"{side}_conv")
    block = min(layer.block_size, x.shape[1])  # fewer rows: one decode block cut short at the end
    x, dynamic = conv.prepare(x, block)
    return conv.finish(sublayer(x), dynamic, block)


def loss_top_k(drafter: Any) -> int:
    top_k: int = drafter.candidate_selector.top_k
    return top_k


def extra_loss(drafter: Any, out: LossOutput, batch: Any, head: torch.Tensor, gold_missing: str,
               chunk: int) -> SelectorOutput | None:
    """The selector loss on the backbone's supervised rows (`selector_loss`; none when no row carries loss)."""
    rows, block = out.supervised, drafter.config.block_size
    if rows is None:
        return None
    predecessors = teacher_predecessors(batch.labels, batch.block_ids, block).flatten()[rows.keep]
    return selector_loss(drafter.candidate_selector, rows.rows, head, rows.top_k, batch.labels.flatten()[rows.keep],
                         predecessors, rows.weights, rows.slots, block, gold_missing, chunk)


def extra_loss_weight(weight: float, ramp: float) -> float:
    return weight * ramp


def propose(drafter: Any, ctx: Any, anchor: int, rows: int, embed: Head, lm_head: Head, sampling: Any,
            generator: torch.Generator | None) -> Proposal:
    """The selector's walk from the anchor over the rows' final hidden states: the best candidate, or a sample of
    softmax(S / T) over the top-k (no top-p / top-k on q, as the reference's `DFlash2DraftModel.propose`)."""
    hidden = drafter.block_hidden(ctx, anchor, embed, rows)
    return drafter.candidate_selector.walk(hidden, lm_head(hidden), anchor, sampling.temperature, generator)


def propose_rows(drafter: Any, hidden: torch.Tensor, lm_head: Head, anchors: torch.Tensor, sampling: Any,
                 generator: torch.Generator | None) -> Proposal:
    return drafter.candidate_selector.walk_rows(hidden, lm_head(hidden), anchors, sampling.temperature, generator)
