"""The trainer's figures per log window: loss, slot accuracy, τ, tokens/s, TFLOP/s and MFU.

Sums stay on the device between logs (no host sync per micro step) and are all-reduced over the
ranks when read. FLOPs are the one FLOP model's (`dflashx.resolve.flops`, via
`dflashx.dflash.metrics.step_flops`); MFU divides them by the resolved peak FLOP/s of one device
times the ranks.

DFlash2 adds the selector's figures (`selector_loss`, `selector_accuracy`, `selector_acceptance_length`,
`selector_gold_in_top_k`, `selector_weight`; `Window._selector`).

Public API: `Window(block_size, peak_flops, world, micro_per_step)` with `.add(...)`, `.read(lr)` and
`.paused()` (time spent in it, a held-out τ measurement, is not the window's).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from dflashx.dflash.loss import accuracy_per_position, expected_acceptance_length
from dflashx.dflash.metrics import peak_memory_bytes
from dflashx.dflash.selector_loss import SelectorOutput


class Window:
    """Sums of loss, slot accuracy, tokens and FLOPs over the micro steps since the last log;
    `read` all-reduces them over the ranks."""

    def __init__(self, block_size: int, peak_flops: float, world: int, micro_per_step: int):
        self.block_size, self.peak_flops, self.world = block_size, peak_flops, world
        self.micro_per_step = micro_per_step
        self.reset()

    def reset(self) -> None:
        # loss, correct[B], count[B] (DFlash2: + selector loss, correct[B], label in the top-k[B]): on the device
        self.device_sums: torch.Tensor | None = None
        self.host = [0.0, 0.0, 0.0]  # micro steps, tokens, flops
        self.selector_scale: float | None = None
        self.start = time.perf_counter()

    def add(self, loss: torch.Tensor, correct: torch.Tensor, count: torch.Tensor, tokens: float, flops: float,
            selector: SelectorOutput | None = None, selector_scale: float = 0.0) -> None:
        parts = [loss.detach().float().view(1), correct.float(), count.float()]
        if selector is not None:
            parts += [selector.loss.detach().float().view(1), selector.correct.float(), selector.hit.float()]
            self.selector_scale = selector_scale
        vec = torch.cat(parts)
        self.device_sums = vec if self.device_sums is None else self.device_sums + vec
        self.host = [self.host[0] + 1, self.host[1] + tokens, self.host[2] + flops]

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent inside is left out of the window's elapsed time: tokens/s, TFLOP/s and MFU stay the
        training's (the pilot's MFU calibration reads them) when a held-out τ measurement runs between steps."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.start += time.perf_counter() - start

    def read(self, lr: float) -> dict[str, Any]:
        import torch.distributed as dist

        sums = self.device_sums if self.device_sums is not None else torch.zeros(1 + 2 * self.block_size)
        packed = torch.cat([sums.double(), torch.tensor(self.host, dtype=torch.float64, device=sums.device)])
        if dist.is_initialized() and self.world > 1:
            dist.all_reduce(packed)
        packed = packed.cpu()
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        b = self.block_size
        loss, correct, count = float(packed[0]), packed[1 : 1 + b], packed[1 + b : 1 + 2 * b]
        n, tokens, flops = packed[-3:].tolist()
        acc = accuracy_per_position(correct, count)
        steps = max(n, 1) / self.micro_per_step
        out = {"loss": loss / max(n, 1), "lr": lr, "accuracy": acc,
               "acceptance_length": expected_acceptance_length(acc),
               "tokens_per_s": tokens / elapsed, "flops_per_step": flops / steps, "tflops": flops / elapsed / 1e12,
               "mfu": flops / elapsed / (self.peak_flops * self.world), "memory_bytes": peak_memory_bytes()}
        if self.selector_scale is not None:
            out |= self._selector(packed[1 + 2 * b : -3], count, max(n, 1))
        self.reset()
        return out

    def _selector(self, sums: torch.Tensor, count: torch.Tensor, n: float) -> dict[str, Any]:
        """DFlash2's figures: the selector loss (its weighted mean k-way CE), its teacher-forced per-slot
        top-1 accuracy and the τ that implies (beside the backbone's `accuracy`), the share of labels
        among the top-k candidates per slot, and the loss weight of the last step (selector_weight x ramp)."""
        b = self.block_size
        acc = accuracy_per_position(sums[1 : 1 + b], count)
        return {"selector_loss": float(sums[0]) / n, "selector_accuracy": acc,
                "selector_acceptance_length": expected_acceptance_length(acc),
                "selector_gold_in_top_k": accuracy_per_position(sums[1 + b : 1 + 2 * b], count),
                "selector_weight": self.selector_scale}
