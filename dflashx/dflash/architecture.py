"""The torch half of a drafter architecture (`ArchitectureSpec.torch` names the module): what it adds to the DFlash
backbone and how it drafts. A module that defines these functions is one (`arch_dflash.py`, `dflash2.py`):

- `FILE_NAMES`: {parameter name: the name a checkpoint stores it under} where they differ (DFlash2's codebooks,
  stored without `.weight` as the published checkpoints store them);
- `layer_modules(config) -> {name: module}`: added to every decoder layer (DFlash2: `attention_conv`, `mlp_conv`);
- `drafter_modules(config) -> {name: module}`: added to the drafter (DFlash2: `candidate_selector`); each module
  added either way has `reset_parameters()`, its own initialisation;
- `around(layer, side, sublayer, x)`: one sublayer (`side`: "attention" or "mlp") of a layer applied to its
  normalised input x (DFlash: `sublayer(x)`; DFlash2: inside the layer's convolution on that side);
- `loss_top_k(drafter)`: the candidates per supervised row the backbone's loss hands on (0: none);
- `extra_loss(drafter, out, batch, head, gold_missing, chunk) -> SelectorOutput | None`: the architecture's own
  loss term on the backbone's `LossOutput` (DFlash: none), and `extra_loss_weight(weight, ramp)`, its weight
  (`stages.train.selector_weight` x the ramp; 0 for none);
- `propose(drafter, ctx, anchor, rows, embed, lm_head, sampling, generator)`: the drafted tokens of one block of
  `rows` rows after `anchor` over the drafter's context `ctx` (`DFlashDrafter.block_hidden` / `draft_block`),
  and their draft distributions q when sampling; `propose_rows(drafter, hidden [b, L, H], lm_head, anchors [b],
  sampling, generator)`: the same for b blocks from their drafted rows' final hidden states (`dflash.proposal`).

`torch_half(name)` imports it on first use (the registry's one function-level import on the torch side).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable, Protocol, cast

import torch
from torch import nn

from dflashx.config.architectures import architecture

if TYPE_CHECKING:
    from dflashx.dflash.config import DFlashConfig
    from dflashx.dflash.loss import LossOutput
    from dflashx.dflash.selector_loss import SelectorOutput

Head = Callable[[torch.Tensor], torch.Tensor]
Proposal = tuple[torch.Tensor, "torch.Tensor | None"]


class TorchHalf(Protocol):
    """See the module doc."""

    FILE_NAMES: dict[str, str]

    def layer_modules(self, config: DFlashConfig) -> dict[str, nn.Module]: ...

    def drafter_modules(self, config: DFlashConfig) -> dict[str, nn.Module]: ...

    def around(self, layer: nn.Module, side: str, sublayer: Head, x: torch.Tensor) -> torch.Tensor: ...

    def loss_top_k(self, drafter: nn.Module) -> int: ...

    def extra_loss(self, drafter: nn.Module, out: LossOutput, batch: Any, head: torch.Tensor, gold_missing: str,
                   chunk: int) -> SelectorOutput | None: ...

    def extra_loss_weight(self, weight: float, ramp: float) -> float: ...

    def propose(self, drafter: Any, ctx: Any, anchor: int, rows: int, embed: Head, lm_head: Head, sampling: Any,
                generator: torch.Generator | None) -> Proposal: ...

    def propose_rows(self, drafter: nn.Module, hidden: torch.Tensor, lm_head: Head, anchors: torch.Tensor,
                     sampling: Any, generator: torch.Generator | None) -> Proposal: ...


def torch_half(name: str) -> TorchHalf:
    """The torch half of the architecture called `name` (imported on first use)."""
    return cast(TorchHalf, importlib.import_module(architecture(name).torch))
