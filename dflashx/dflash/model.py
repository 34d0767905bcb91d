"""The DFlash drafter: a small stack of Qwen3-style layers conditioned on target features.

Architecture (DFlash, arXiv 2602.06036; parameter names as in the public z-lab checkpoints):
  fc:            Linear(k * H -> H, no bias) over the concatenated features of k target layers,
  hidden_norm:   RMSNorm on that fused context,
  layers.N:      input_layernorm -> self_attn (q/k/v/o_proj, q_norm, k_norm) -> residual ->
                 post_attention_layernorm -> mlp (gate/up/down_proj, SwiGLU) -> residual,
  norm:          final RMSNorm.
In every layer the queries come from the block tokens only; keys/values are
[projections of the fused context ; projections of the block hidden states], with k-norm and RoPE
at absolute positions on both. The embedding and the LM head are the target's, frozen and shared:
they are passed in, never parameters of the drafter, never saved with it.

Public API:
  `DFlashDrafter(config)`;
  `fuse(features [b, T, k*H]) -> context [b, T, H]` (fc then hidden_norm);
  `forward(block_embeds [b, Q, H], context [b, T, H] (already fused), block_positions [b, Q],
           context_positions [b, T], mask: DraftMask) -> hidden [b, Q, H]` (after the final norm);
  `extend_context(ctx | None, features [1, n, k*H]) -> DraftContext` — decoding: the next n context
  positions fused and projected to each layer's keys/values once (a cache that only grows;
  `project_context(features [b, n, k*H], positions [b, n])` is that projection, for any batch);
  `block_hidden(ctx, anchor_id, embed, rows=None) -> hidden [rows-1, H]` — one block
  [anchor, MASK x (rows-1)] at positions T..T+rows-1 over the T = ctx.length context positions
  (rows: the block size, or fewer for a block cut short at the end of generation, as the reference
  drafts it), the drafted rows' final hidden states (DFlash2's selector walks them);
  `rows_hidden(context_kv, starts [b], anchor_ids [b], embed, rows, used=None) -> hidden [b, rows-1, H]` —
  the same for b blocks at once, each over its own context length (batched decoding);
  `draft_block(ctx, anchor_id, embed, lm_head, rows=None) -> logits [rows-1, V]` — their logits;
  `block_input_ids(anchor_ids [..], block_size, mask_token_id)` — [anchor, MASK, ...] rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any, Callable, cast

import torch
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding, rotate_half

from dflashx.dflash.architecture import torch_half
from dflashx.dflash.config import DFlashConfig
from dflashx.dflash.masks import DraftMask, attend


KV = tuple[torch.Tensor, torch.Tensor]


@dataclass
class DraftContext:
    """The drafter's view of the context while decoding: each layer's keys and values of the fused
    target features at positions 0..length-1 (`DFlashDrafter.extend_context` grows it)."""

    kv: list[KV]
    length: int


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [b, heads, L, d] by cos/sin [b, L, d]."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


class DFlashAttention(nn.Module):
    def __init__(self, config: DFlashConfig, layer_idx: int):
        super().__init__()
        h, d, bias = config.hidden_size, config.head_dim, config.attention_bias
        self.head_dim = d
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.causal = config.causal_layers[layer_idx]
        self.window = config.sliding_window if config.layer_types[layer_idx] == "sliding_attention" else None
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=bias)
        self.q_norm = Qwen3RMSNorm(d, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(d, eps=config.rms_norm_eps)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x.view(*x.shape[:2], n, self.head_dim)

    def project_kv(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> KV:
        """Keys (k-norm, then RoPE) and values [b, Hkv, L, d] of rows x [b, L, H]."""
        k = self.k_norm(self._heads(self.k_proj(x), self.num_kv_heads)).transpose(1, 2)
        v = self._heads(self.v_proj(x), self.num_kv_heads).transpose(1, 2)
        return _rope(k, *rope), v

    def forward(self, hidden: torch.Tensor, context_kv: KV, rope_block: tuple[torch.Tensor, torch.Tensor],
                mask: Any) -> torch.Tensor:
        """Block queries over [context keys ; block keys]; `context_kv` from `project_kv`; `mask` this
        layer's `DraftMask.for_layer` object (built before the layers run, outside compiled code)."""
        q = _rope(self.q_norm(self._heads(self.q_proj(hidden), self.num_heads)).transpose(1, 2), *rope_block)
        k, v = self.project_kv(hidden, rope_block)
        k, v = torch.cat([context_kv[0], k], dim=2), torch.cat([context_kv[1], v], dim=2)
        out = attend(q, k, v, mask, self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(*hidden.shape[:2], -1))


class DFlashDecoderLayer(nn.Module):
    """norm -> sublayer -> residual add, for attention then the MLP; the architecture's modules on the layer
    (`TorchHalf.layer_modules`) and its `around` each sublayer (DFlash2: a convolution on either side of it)."""

    def __init__(self, config: DFlashConfig, qwen3_config, layer_idx: int):
        super().__init__()
        self.self_attn = DFlashAttention(config, layer_idx)
        self.mlp = Qwen3MLP(qwen3_config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.block_size = config.block_size
        half = torch_half(config.architecture)
        own = half.layer_modules(config)
        for name, module in own.items():
            self.add_module(name, module)
        self.own_modules = frozenset(own)
        self._around = half.around

    def forward(self, hidden: torch.Tensor, context_kv: KV, rope_block: tuple[torch.Tensor, torch.Tensor],
                mask: Any) -> torch.Tensor:
        hidden = hidden + self._around(self, "attention", lambda x: self.self_attn(x, context_kv, rope_block, mask),
                                       self.input_layernorm(hidden))
        return hidden + self._around(self, "mlp", self.mlp, self.post_attention_layernorm(hidden))


def block_input_ids(anchor_ids: torch.Tensor, block_size: int, mask_token_id: int) -> torch.Tensor:
    """[..., B] rows [anchor, MASK, ..., MASK] for anchor ids of any shape."""
    out = torch.full((*anchor_ids.shape, block_size), mask_token_id, dtype=torch.long, device=anchor_ids.device)
    out[..., 0] = anchor_ids
    return out


class DFlashDrafter(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.config = config
        qwen3 = config.to_qwen3_config()
        self.layers = nn.ModuleList(DFlashDecoderLayer(config, qwen3, i) for i in range(config.num_layers))
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.fc = nn.Linear(config.k * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(qwen3)
        own = torch_half(config.architecture).drafter_modules(config)
        for name, module in own.items():
            self.add_module(name, module)
        # the architecture's modules, by name on the drafter and its layers: they start as their trainers start them
        self.own_modules = frozenset(own).union(*(layer.own_modules for layer in self.decoder_layers))
        self.reset_parameters()

    @property
    def decoder_layers(self) -> Sequence[DFlashDecoderLayer]:
        """`layers` as what they hold (iterating an `nn.ModuleList` gives the type checker plain Modules)."""
        return cast("Sequence[DFlashDecoderLayer]", self.layers)

    def restore_rope(self) -> None:
        """Rebuild the RoPE frequencies in fp32 (engines that cast buffers to bf16 lose them)."""
        device = self.fc.weight.device
        self.rotary_emb = Qwen3RotaryEmbedding(self.config.to_qwen3_config()).to(device)

    def reset_parameters(self, std: float = 0.02) -> None:
        """Normal(0, std) linear weights, unit norms (the Qwen3 initialisation)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, Qwen3RMSNorm):
                nn.init.ones_(module.weight)
        for name, module in self.named_modules():  # the architecture's own (module doc of dflash.architecture)
            if name.rsplit(".", 1)[-1] in self.own_modules:
                module.reset_parameters()

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Concatenated target features [b, T, k*H] -> fused context [b, T, H]."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))

    def forward(
        self,
        block_embeds: torch.Tensor,
        context: torch.Tensor,
        block_positions: torch.Tensor,
        context_positions: torch.Tensor,
        mask: DraftMask,
    ) -> torch.Tensor:
        rope_ctx = self.rotary_emb(context, context_positions)
        return self._decode(block_embeds, block_positions, mask,
                            [layer.self_attn.project_kv(context, rope_ctx) for layer in self.decoder_layers])

    def _decode(self, block_embeds: torch.Tensor, block_positions: torch.Tensor, mask: DraftMask,
                context_kv: list[KV]) -> torch.Tensor:
        hidden = block_embeds.to(self.fc.weight.dtype)
        rope_block = self.rotary_emb(hidden, block_positions)
        masks = [mask.for_layer(layer.self_attn.causal, layer.self_attn.window) for layer in self.decoder_layers]
        for layer, kv, layer_mask in zip(self.layers, context_kv, masks):
            hidden = layer(hidden, kv, rope_block, layer_mask)
        return self.norm(hidden)

    @torch.no_grad()
    def project_context(self, features: torch.Tensor, positions: torch.Tensor) -> list[KV]:
        """Every layer's context keys and values [b, Hkv, n, d] of target features [b, n, k*H] at positions
        [b, n] (fused, k-normed, RoPE'd: what a context position contributes to every later block)."""
        fused = self.fuse(features)
        rope = self.rotary_emb(fused, positions)
        return [layer.self_attn.project_kv(fused, rope) for layer in self.decoder_layers]

    @torch.no_grad()
    def extend_context(self, ctx: DraftContext | None, features: torch.Tensor) -> DraftContext:
        """`ctx` with the target features [1, n, k*H] of the next n positions appended (fused,
        projected to every layer's keys and values once, never recomputed)."""
        start = ctx.length if ctx is not None else 0
        positions = torch.arange(start, start + features.shape[1], device=features.device)[None]
        new = self.project_context(features, positions)
        if ctx is not None:
            new = [(torch.cat([k0, k], dim=2), torch.cat([v0, v], dim=2)) for (k0, v0), (k, v) in zip(ctx.kv, new)]
        return DraftContext(new, start + features.shape[1])

    @torch.no_grad()
    def rows_hidden(self, context_kv: list[KV], starts: torch.Tensor, anchor_ids: torch.Tensor,
                    embed: Callable[[torch.Tensor], torch.Tensor], rows: int,
                    used: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states [b, rows-1, H] of the drafted rows of b blocks [anchor, MASK x (rows-1)], block i
        at positions starts[i].. over the first starts[i] of its context keys/values (`context_kv`: each
        layer's [b, Hkv, T, d], T >= max(starts)); `used` [b]: the rows block i has (its drafted rows past
        them are computed but see nothing of them: a shorter block drafts as it would alone)."""
        ids = block_input_ids(anchor_ids, rows, self.config.mask_token_id)
        positions = starts[:, None] + torch.arange(rows, device=starts.device)
        # dense masks: cheaper than building a flex block mask every cycle
        mask = DraftMask(starts[:, None], context_kv[0][0].shape[2], rows, backend="sdpa", rows=used)
        return self._decode(embed(ids), positions, mask, context_kv)[:, 1:]

    @torch.no_grad()
    def block_hidden(self, ctx: DraftContext, anchor_id: int, embed: Callable[[torch.Tensor], torch.Tensor],
                     rows: int | None = None) -> torch.Tensor:
        """Final hidden states [rows-1, H] of the drafted rows of the block [anchor, MASK x (rows-1)]
        placed at position `ctx.length` (rows: the block size unless given)."""
        device = ctx.kv[0][0].device
        start, anchor = torch.tensor([ctx.length], device=device), torch.tensor([anchor_id], device=device)
        return self.rows_hidden(ctx.kv, start, anchor, embed, rows or self.config.block_size)[0]

    @torch.no_grad()
    def draft_block(
        self,
        ctx: DraftContext,
        anchor_id: int,
        embed: Callable[[torch.Tensor], torch.Tensor],
        lm_head: Callable[[torch.Tensor], torch.Tensor],
        rows: int | None = None,
    ) -> torch.Tensor:
        """Logits [rows-1, V] of the drafted rows (`block_hidden`)."""
        return lm_head(self.block_hidden(ctx, anchor_id, embed, rows))
