"""The torch half of the export round-trip gate (`dflashx.run.roundtrip`): the target's own greedy
continuation of a prompt, a drafter overfitted on a few such samples, and the τ it decodes with.

- `greedy(target, prompt_ids, max_new_tokens, stop_ids)`: the target's greedy continuation (what the
  engines verify against at temperature 0, so an overfitted drafter can match it block after block).
- `overfit(drafter, target, samples, steps, lr, gamma, selector_weight)`: `steps` AdamW steps of the
  training objective (`dflashx.dflash.step.TrainModule`: the drafter, the DFlash loss, DFlash2's
  selector loss) on every anchor of every sample (`valid_anchor_positions`), the target's features
  captured once (`FeatureCapture`, as the train stage captures them). Plain torch, not the DeepSpeed
  engine: the gate checks what is exported and decoded, the pilot's training measures the engine. Eager
  attention with the dense mask (SDPA) on every device: two short samples, and compiling flex attention
  for them would cost the gate more than its whole overfit.
- `decode_tau(target, drafter, samples, stop_ids)`: greedy speculative decoding of each sample's
  prompt (`SpecDecoder`, the eval stage's loop) for as many tokens as the target produced; the mean τ.

Public API: `Sample`, `greedy`, `overfit`, `decode_tau`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from dflashx.dflash.acceptance import summarize
from dflashx.dflash.anchors import build_block_batch, valid_anchor_positions
from dflashx.dflash.architecture import torch_half
from dflashx.dflash.capture import FeatureCapture
from dflashx.dflash.masks import DraftMask
from dflashx.dflash.model import DFlashDrafter
from dflashx.dflash.spec_decode import SpecDecoder
from dflashx.dflash.step import LM_HEAD_CHUNK, TrainModule


@dataclass(frozen=True)
class Sample:
    """One training sample as the tokenize stage encodes it (`input_ids`, `loss_mask`), and what the
    engine decodes from (`prompt_ids`, the rendered generation prompt) for `new_tokens` tokens."""

    prompt_ids: list[int]
    input_ids: list[int]
    loss_mask: list[int]
    new_tokens: int


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def greedy(target: Any, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids: Sequence[int]) -> list[int]:
    """The target's (a transformers causal LM: `generate` is untyped for mypy) greedy continuation of
    `prompt_ids`, up to and including the first stop token."""
    out = target.generate(torch.tensor([list(prompt_ids)], device=_device(target)), max_new_tokens=max_new_tokens,
                          do_sample=False, eos_token_id=list(stop_ids) or None, pad_token_id=(list(stop_ids) or [0])[0])
    new = out[0, len(prompt_ids):].tolist()
    end = next((i for i, t in enumerate(new) if t in set(stop_ids)), len(new) - 1)
    return new[: end + 1]


def overfit(drafter: DFlashDrafter, target: PreTrainedModel, samples: Sequence[Sample], steps: int, lr: float,
            gamma: float, selector_weight: float = 0.0) -> float:
    """Train `drafter` in place on every anchor of `samples` for `steps` steps; the last step's loss."""
    device, cfg = _device(target), drafter.config
    capture = FeatureCapture(target, list(cfg.target_layer_ids))
    embed, head = target.get_input_embeddings(), target.get_output_embeddings().weight.detach()
    module = TrainModule(drafter, LM_HEAD_CHUNK, "torch", "decay_ce", 0.0).to(device)
    batches = []
    for s in samples:
        ids, mask = torch.tensor([s.input_ids]), torch.tensor([s.loss_mask])
        anchors = [valid_anchor_positions(mask[0])]
        blocks = build_block_batch(ids, mask, anchors, cfg.block_size, cfg.mask_token_id, gamma).to(device)
        features = capture.capture(ids.to(device))
        with torch.no_grad():
            block_embeds = embed(blocks.block_ids)
        batches.append((block_embeds, features, blocks, torch.arange(ids.shape[1], device=device)[None],
                        DraftMask(blocks.anchors, ids.shape[1], cfg.block_size, backend="sdpa")))
    scale = torch_half(cfg.architecture).extra_loss_weight(selector_weight, 1.0)
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    drafter.train()
    loss = torch.zeros(())
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = sum((module(*batch, head, scale)[0] for batch in batches), torch.zeros((), device=device))
        loss.backward()
        optimizer.step()
    drafter.eval()
    return float(loss.detach()) / max(1, len(batches))


def decode_tau(target: PreTrainedModel, drafter: DFlashDrafter, samples: Sequence[Sample],
               stop_ids: Sequence[int]) -> float:
    """Mean τ of greedy speculative decoding of each sample's prompt for its `new_tokens` tokens."""
    decoder = SpecDecoder(target, drafter.to(_device(target)).eval())
    runs = [decoder.generate(s.prompt_ids, s.new_tokens, 0.0, stop_ids) for s in samples]
    return summarize(runs, drafter.config.block_size)["tau"]
