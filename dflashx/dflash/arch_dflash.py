"""DFlash's torch half (`dflashx.dflash.architecture`): the backbone alone; its drafts are the argmax of each row's
logits, or a sample of the serving distribution (`proposal.choose`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dflashx.dflash.architecture import Head, Proposal
from dflashx.dflash.config import DFlashConfig
from dflashx.dflash.loss import LossOutput
from dflashx.dflash.proposal import choose


FILE_NAMES: dict[str, str] = {}


def layer_modules(config: DFlashConfig) -> dict[str, nn.Module]:
    return {}


def drafter_modules(config: DFlashConfig) -> dict[str, nn.Module]:
    return {}


def around(layer: nn.Module, side: str, sublayer: Head, x: torch.Tensor) -> torch.Tensor:
    return sublayer(x)


def loss_top_k(drafter: nn.Module) -> int:
    return 0


def extra_loss(drafter: nn.Module, out: LossOutput, batch: Any, head: torch.Tensor, gold_missing: str,
               chunk: int) -> None:
    return None


def extra_loss_weight(weight: float, ramp: float) -> float:
    return 0.0


def propose(drafter: Any, ctx: Any, anchor: int, rows: int, embed: Head, lm_head: Head, sampling: Any,
            generator: torch.Generator | None) -> Proposal:
    return choose(drafter.draft_block(ctx, anchor, embed, lm_head, rows=rows), sampling, generator)


def propose_rows(drafter: nn.Module, hidden: torch.Tensor, lm_head: Head, anchors: torch.Tensor, sampling: Any,
                 generator: torch.Generator | None) -> Proposal:
    return choose(lm_head(hidden), sampling, generator)
