"""One AdamW step on a GPU: torch's foreach and fused kernels, and DeepSpeed's compiled `fused_adam` (the
GPU path before issue 38) where it builds, on the shapes a drafter's optimizer steps.

Shapes: one flat fp32 partition per group, as ZeRO 1/2 hands the optimizer (`--params` elements; default
127,408,640: Muon's AdamW half of the Qwen3.6-27B DFlash2 drafter, its two selector codebooks plus the norms,
on one GPU), and the same split over 34 tensors (ZeRO 0). Each figure is the median of `--iters` timed
steps (CUDA events) after 5 warm-ups. DeepSpeed's op needs nvcc and a `TORCH_CUDA_ARCH_LIST` it can parse:
run with `TORCH_CUDA_ARCH_LIST=9.0` on NVIDIA's images (their `9.0a` is what broke it); without a build it is
left out and the output says why.

Usage: python benchmarks/adam_step.py [--params N] [--iters N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

ADAM_HALF_QWEN36_DFLASH2 = 127_408_640
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.01


def _params(total: int, pieces: int) -> list[torch.nn.Parameter]:
    sizes = [total // pieces] * pieces
    sizes[-1] += total - sum(sizes)
    params = [torch.nn.Parameter(torch.randn(n, device="cuda")) for n in sizes]
    for p in params:
        p.grad = torch.randn_like(p)
    return params


def _median_ms(step: Callable[[], object], iters: int) -> float:
    for _ in range(5):
        step()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _deepspeed_fused_adam(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer | str:
    try:
        from deepspeed.ops.adam import FusedAdam

        return FusedAdam(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, adam_w_mode=True)
    except Exception as exc:  # noqa: BLE001 - any build failure is the finding: reported, not raised
        return f"not built: {type(exc).__name__}: {str(exc)[:200]}"


def measure(total: int, iters: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for pieces in (1, 34):
        kinds: dict[str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer | str]] = {
            "torch foreach": lambda ps: torch.optim.AdamW(ps, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD),
            "torch fused": lambda ps: torch.optim.AdamW(ps, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                                                        fused=True),
            "deepspeed fused_adam": _deepspeed_fused_adam,
        }
        for kind, make in kinds.items():
            params = _params(total, pieces)
            opt = make(params)
            row: dict[str, object] = {"kind": kind, "tensors": pieces, "params": total}
            row |= {"ms": round(_median_ms(opt.step, iters), 3)} if not isinstance(opt, str) else {"skipped": opt}
            rows.append(row)
            print(json.dumps(row), flush=True)
            del params, opt
            torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=ADAM_HALF_QWEN36_DFLASH2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    rows = measure(args.params, args.iters)
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                        "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
