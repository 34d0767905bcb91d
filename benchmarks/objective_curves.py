"""Objectives and optimizers at a real layer shape (the lent H200): learning curves on a learnable
stream, and the time of one optimizer step at the seeds' gradient accumulation.

Curves: the Qwen3-32B-shaped target of benchmarks/train_step.py (random weights, `--target-layers`),
the product's `TrainStep` (GPU defaults), one optimizer step per batch of the first-order Markov
stream `train_step.markov_batches` (same batches, seed and schedule for every variant); each
variant logs its loss and per-position accuracy per step and its wall time, so the comparison is
at equal optimizer steps and at equal GPU time. The label source is not compared here: a random
target's argmax is not the stream, so its labels are another task (the tiny ablation compares it).

Step time: the seeds' accumulation (`--accum`: 16 is recipes/qwen36_27b.yaml's global batch 64 on its
4-GPU profile, per rank; 64 the same recipe on one H200, `h200_x1`) at the seeds' shape (seq 3072,
512 anchors x 16, 5 drafter layers, ZeRO 2); the time of `--opt-steps` whole optimizer steps (each
`--accum` micro steps and one optimizer update, Muon's Newton-Schulz included) per variant, after one
warm-up optimizer step.

    python -m benchmarks.objective_curves                 # on the GPU
    python -m benchmarks.objective_curves --tiny          # small shapes on CPU (a smoke test)
Rows print as they finish; writes benchmarks/results/objective_curves.json (_tiny with --tiny).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from benchmarks.step_parts import build_target, random_batch, sync  # noqa: E402
from benchmarks.train_step import SHAPES, TINY, _free, environment, make_job, markov_batches  # noqa: E402
from dflashx.dflash.distributed import setup_distributed  # noqa: E402
from dflashx.dflash.step import TrainStep  # noqa: E402
from dflashx.dflash.trainer import build_drafter  # noqa: E402

RESULTS = _HERE / "results" / "objective_curves.json"
VARIANTS: dict[str, dict[str, Any]] = {
    "decay_ce + adamw (before)": {"loss": "decay_ce", "optimizer": "adamw"},
    "dpace + adamw": {"loss": "dpace", "optimizer": "adamw"},
    "decay_ce + muon": {"loss": "decay_ce", "optimizer": "muon"},
    "dpace + muon": {"loss": "dpace", "optimizer": "muon"},
}


def _trainer(name: str, shape: dict[str, Any], target: Any, args: argparse.Namespace, train: dict[str, Any],
             stage: str, total: int, device: str) -> TrainStep:
    job = make_job(name, shape, target, args, {"stages": {"train": train}}, stage)
    torch._dynamo.reset()
    _free()
    with torch.device(device):
        drafter = build_drafter(job, target.config)
    return TrainStep(job, target, drafter, total, torch.device(device))


def curves(args, device: str, shape: dict[str, Any], save, out: dict[str, Any]) -> None:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    target = build_target(shape, args.target_layers, device, dtype)
    batches = markov_batches(shape["vocab_size"], args.curve_seq, args.curve_steps, ids=args.curve_ids)
    cargs = argparse.Namespace(**(vars(args) | {"anchors": args.curve_anchors, "seq": args.curve_seq}))
    out.update({"steps": args.curve_steps, "seq": args.curve_seq, "anchors": args.curve_anchors, "ids": args.curve_ids,
                "lr": args.curve_lr,
                "target_layers": args.target_layers, "variants": {}})
    for name, train in VARIANTS.items():
        with tempfile.TemporaryDirectory() as stage:
            trainer = _trainer("qwen3-32b-dense", shape, target, cargs,
                               train | {"global_batch": 1, "micro_batch": 1, "lr": args.curve_lr},
                               stage, args.curve_steps, device)
            losses, accuracy, seconds = [], [], []
            sync()
            start = time.perf_counter()
            for batch in batches:
                r = trainer.step(batch, 0)
                losses.append(float(r.loss.detach()))
                accuracy.append((r.correct[1:] / r.count[1:].clamp_min(1)).tolist())
                sync()
                seconds.append(time.perf_counter() - start)
            trainer.engine.destroy()
            trainer = None
        tail = max(1, args.curve_steps // 10)
        row = {"train": train, "loss": losses, "accuracy": accuracy, "seconds": seconds,
               "last_loss_mean": sum(losses[-tail:]) / tail,
               "last_accuracy_mean": [sum(a[k] for a in accuracy[-tail:]) / tail for k in range(len(accuracy[0]))]}
        out["variants"][name] = row
        print(f"curve {name:28} loss {losses[0]:.3f} -> {row['last_loss_mean']:.3f}  acc@1 "
              f"{row['last_accuracy_mean'][0]:.3f} "
              f"acc@8 {row['last_accuracy_mean'][min(7, len(accuracy[0]) - 1)]:.3f}  "
              f"{seconds[-1] / len(losses) * 1e3:.0f} ms/step", flush=True)
        save()


def step_times(args, device: str, shape: dict[str, Any], save, out: dict[str, Any]) -> None:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    target = build_target(shape, args.target_layers, device, dtype)
    batch = random_batch(shape["vocab_size"], args.seq)
    out.update({"accum": args.accum, "seq": args.seq, "anchors": args.anchors, "opt_steps": args.opt_steps, "rows": {}})
    for name, train in VARIANTS.items():
        if args.variants and name not in args.variants:
            continue
        with tempfile.TemporaryDirectory() as stage:
            trainer = _trainer("qwen3-32b-dense", shape, target, args,
                               train | {"global_batch": args.accum, "micro_batch": 1}, stage, 1000, device)
            assert trainer.job.train.grad_accum == args.accum
            for _ in range(args.accum):  # one warm-up optimizer step (compiles, first Muon call)
                trainer.step(batch, 0)
            sync()
            start = time.perf_counter()
            for _ in range(args.accum * args.opt_steps):
                trainer.step(batch, 0)
            sync()
            per_step = (time.perf_counter() - start) / args.opt_steps
            kernels = trainer.kernels
            trainer.engine.destroy()
            trainer = None
        out["rows"][name] = {"train": train, "optimizer_step_s": per_step, "kernels": kernels,
                             "peak_memory_gb": torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else None}
        base = next(iter(out["rows"].values()))["optimizer_step_s"]
        print(f"step  {name:28} {per_step:8.3f} s per optimizer step ({args.accum} micro)  "
              f"{per_step / base:.3f}x before", flush=True)
        save()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--part", choices=["all", "curves", "steps"], default="all")
    p.add_argument("--target-layers", type=int, default=16)
    p.add_argument("--drafter-layers", type=int, default=5)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--seq", type=int, default=3072)
    p.add_argument("--anchors", type=int, default=512)
    p.add_argument("--accum", type=int, default=16)
    p.add_argument("--opt-steps", type=int, default=2)
    p.add_argument("--curve-steps", type=int, default=300)
    p.add_argument("--curve-seq", type=int, default=1024)
    p.add_argument("--curve-anchors", type=int, default=128)
    p.add_argument("--curve-ids", type=int, default=256, help="token ids of the Markov stream (fewer: learnt sooner)")
    p.add_argument("--curve-lr", type=float, default=6e-4, help="the seeds' lr (recipes/qwen36_27b.yaml)")
    p.add_argument("--variants", nargs="*", default=[], help="only these of VARIANTS (default: all)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.tiny:
        args.target_layers, args.drafter_layers, args.block = 4, 2, 4
        args.seq, args.anchors, args.accum, args.opt_steps = 96, 12, 2, 1
        args.curve_steps, args.curve_seq, args.curve_anchors = 12, 64, 8
    device = "cuda" if torch.cuda.is_available() else "cpu"
    setup_distributed()
    shape = SHAPES["qwen3-32b-dense"] | (TINY if args.tiny else {})
    out = args.out or RESULTS.with_name(f"{RESULTS.stem}_tiny.json" if args.tiny else RESULTS.name)
    report: dict[str, Any] = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                              "environment": environment(device), "curves": {}, "step_times": {}}

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        os.replace(tmp, out)

    if args.part in ("all", "steps"):
        step_times(args, device, shape, save, report["step_times"])
        _free()
    if args.part in ("all", "curves"):
        curves(args, device, shape, save, report["curves"])
    save()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
