"""Parts of `benchmarks/train_step.py`: the random target of a real layer shape, a random batch, a
timer, the matmul peak and the naive online step it is compared with."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.shapes import build_target  # noqa: F401  (read by other benchmarks through this module)
from dflashx.dflash.anchors import build_block_batch, sample_anchors
from dflashx.dflash.job import TrainJob
from dflashx.dflash.masks import DraftMask
from dflashx.dflash.trainer import build_drafter


def random_batch(vocab: int, seq: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """One collated row as the data loader gives it: random tokens, the first eighth a prompt without loss."""
    g = torch.Generator().manual_seed(seed)
    loss_mask = torch.ones(1, seq, dtype=torch.long)
    loss_mask[:, : seq // 8] = 0
    return {"input_ids": torch.randint(0, vocab - 2, (1, seq), generator=g), "loss_mask": loss_mask,
            "attention_mask": torch.ones(1, seq, dtype=torch.long), "index": torch.tensor([seed])}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], warmup: int, iters: int) -> tuple[float, float]:
    """(seconds of the first call, mean seconds per call after `warmup` calls)."""
    t0 = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - t0
    for _ in range(warmup - 1):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return first, (time.perf_counter() - t0) / iters


def matmul_peak(device: str, n: int, fp8: bool) -> float | None:
    """Achieved TFLOP/s of an n x n x n matmul in bf16 (or fp8 via _scaled_mm); None if unsupported."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    if fp8:
        one = torch.ones((), device=device)
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t().contiguous().t()

        def fn() -> torch.Tensor:
            return torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        def fn() -> torch.Tensor:
            return a @ b
    try:
        _, seconds = timed(fn, 3, 20 if device == "cuda" else 2)
    except (RuntimeError, TypeError):
        return None
    return 2 * n**3 / seconds / 1e12


class NaiveStep:
    """The naive online step: all hidden states and logits of the target, a dense mask over every key,
    full-vocabulary logits for every slot, plain AdamW."""

    def __init__(self, target: nn.Module, job: TrainJob, batch: dict[str, torch.Tensor], device: str):
        self.target, self.device = target, device
        with torch.device(device):
            self.drafter = build_drafter(job, target.config).to(torch.bfloat16 if device == "cuda" else torch.float32)
        cfg, train = self.drafter.config, job.train
        self.cfg = cfg
        anchors = sample_anchors(batch["loss_mask"][0], train.anchors_per_seq, train.seed, 0, 0)
        self.blocks = build_block_batch(batch["input_ids"], batch["loss_mask"], [anchors], cfg.block_size,
                                        cfg.mask_token_id, train.loss_gamma).to(device)
        self.input_ids = batch["input_ids"].to(device)
        self.head = target.get_output_embeddings().weight
        self.opt = torch.optim.AdamW(self.drafter.parameters(), lr=1e-5, fused=device == "cuda")

    def __call__(self) -> None:
        d, b, cfg = self.drafter, self.blocks, self.cfg
        with torch.no_grad():
            out = self.target(self.input_ids, output_hidden_states=True, use_cache=False)
            features = torch.cat([out.hidden_states[i + 1] for i in cfg.target_layer_ids], -1)
            out.logits.float().sum()  # the target's full logits are materialised, as a naive step does
        width = self.input_ids.shape[1]
        mask = DraftMask(b.anchors, width, cfg.block_size, backend="sdpa")
        positions = torch.arange(width, device=self.device)[None]
        embeds = self.target.get_input_embeddings()(b.block_ids)
        hidden = d(embeds, d.fuse(features), b.block_positions, positions, mask)
        logits = (hidden @ self.head.t()).float()
        ce = F.cross_entropy(logits.flatten(0, 1), b.labels.flatten(), reduction="none")
        w = b.weights.flatten()
        ((ce * w).sum() / w.sum()).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
