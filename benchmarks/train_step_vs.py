"""The product trainer's step beside an older checkout's, interleaved in one process on one target.

Issue 38 asks that removing the compiled ops costs the trainer nothing measurable: its step at the Qwen3-32B
benchmark shape (`benchmarks/train_step.py`'s target and batch), DFlash and DFlash2, within 3% of f5ac536's.
Separate processes would each rebuild the target and run on a GPU in another thermal and allocator state, so
both trainers run here, one after the other, `--repeats` times, in ABBA order (main, baseline, baseline,
main, ...): the older checkout's `dflashx/` is copied under another package name (`dflashx_base`), its
imports renamed, and it builds its TrainJob, drafter and DeepSpeed engine from the same recipe overrides as
the product's (`train_step.make_job`). Each repeat rebuilds its trainer (its compile hits the inductor cache
after the first) and times `--iters` steps after `--warmup`; the row is the median over repeats.

    git archive f5ac536 dflashx | tar -x -C /tmp/f5ac536
    python -m benchmarks.train_step_vs --baseline /tmp/f5ac536 --label f5ac536   # on the GPU

The baseline of f5ac536 JIT-builds DeepSpeed's fused Adam, which cannot parse an arch list such as the CUDA
images' `9.0a` (issue 38): `--baseline-arch-list` (default 9.0) is set for its builds only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest.mock import patch

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.shapes import SHAPES, build_target, shape_of
from benchmarks.step_parts import random_batch, timed
from benchmarks.train_step import VARIANTS, _free, add_step_args, code_of, environment, make_job

RESULTS = Path(__file__).resolve().parent / "results" / "train_step_vs.json"
BASE = "dflashx_base"
_IMPORT = re.compile(r"\bdflashx(?=[.\s]|$)", re.M)


def install_baseline(root: Path, into: Path) -> None:
    """Copy `root/dflashx` to `into/dflashx_base`, every reference to the package renamed."""
    dest = into / BASE
    shutil.copytree(root / "dflashx", dest, ignore=shutil.ignore_patterns("__pycache__"))
    for path in dest.rglob("*.py"):
        path.write_text(_IMPORT.sub(BASE, path.read_text()))
    sys.path.insert(0, str(into))


def one_repeat(code, label: str, variant: str, shape_name: str, target, batch, args, arch_list: str | None) -> dict:
    overrides = dict(VARIANTS)[variant]
    env = {"TORCH_CUDA_ARCH_LIST": arch_list} if arch_list is not None else {}
    with patch.dict(os.environ, env), tempfile.TemporaryDirectory() as stage:
        job = make_job(shape_name, shape_of(shape_name, args.tiny), target, args, overrides, stage, code)
        torch._dynamo.reset()
        _free()
        device = torch.device(args.device)
        with device:
            drafter = code.build_drafter(job, target.config)
        trainer = code.TrainStep(job, target, drafter, 1000, device)
        t0 = time.perf_counter()
        first, seconds = timed(lambda: trainer.step(batch, 0), args.warmup, args.iters)
        trainer.engine.destroy()
        trainer = drafter = None  # frees the engine before the next trainer builds one
    return {"code": label, "variant": variant, "step_s": seconds, "first_call_s": first,
            "row_s": time.perf_counter() - t0}


def summarise(samples: list[dict], variants: list[str], label: str) -> list[dict]:
    rows = []
    for variant in variants:
        main = [s["step_s"] for s in samples if s["variant"] == variant and s["code"] == "main"]
        base = [s["step_s"] for s in samples if s["variant"] == variant and s["code"] == label]
        if main and base:
            m, b = statistics.median(main), statistics.median(base)
            rows.append({"variant": variant, "repeats": min(len(main), len(base)), "main_ms": m * 1e3,
                         f"{label}_ms": b * 1e3, "main_over_baseline": m / b})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", type=Path, required=True, help="a checkout (or `git archive`) holding dflashx/")
    p.add_argument("--label", default="baseline", help="the baseline's name in the results (its commit)")
    p.add_argument("--baseline-arch-list", default="9.0", help="TORCH_CUDA_ARCH_LIST for the baseline's builds")
    p.add_argument("--shape", choices=list(SHAPES), default="qwen3-32b-dense")
    p.add_argument("--variants", nargs="*", default=["trainer", "trainer, dflash2"])
    p.add_argument("--repeats", type=int, default=5)
    add_step_args(p)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    unknown = set(args.variants) - set(dict(VARIANTS))
    if unknown:
        p.error(f"--variants: unknown {sorted(unknown)}; choose from {[v for v, _ in VARIANTS]}")
    if args.label == "main":
        p.error("--label main names this checkout; give the baseline its commit")
    from dflashx.dflash.distributed import setup_distributed

    setup_distributed()
    scratch = Path(tempfile.mkdtemp())
    install_baseline(args.baseline, scratch)
    codes = {"main": (code_of("dflashx"), None), args.label: (code_of(BASE), args.baseline_arch_list)}
    shape = shape_of(args.shape, args.tiny)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    target = build_target(shape, args.target_layers, args.device, dtype)
    batch = random_batch(shape["vocab_size"], args.seq)
    result: dict[str, Any] = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                              "environment": environment(args.device), "samples": [], "rows": []}
    order = ["main", args.label]
    for rep in range(args.repeats):
        for variant in args.variants:
            for label in order if rep % 2 == 0 else order[::-1]:
                code, arch = codes[label]
                sample = one_repeat(code, label, variant, args.shape, target, batch, args, arch)
                result["samples"].append(sample | {"repeat": rep})
                print(f"repeat {rep} {variant:20} {label:10} {sample['step_s'] * 1e3:8.1f} ms "
                      f"(first call {sample['first_call_s']:.1f} s)", flush=True)
        result["rows"] = summarise(result["samples"], args.variants, args.label)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    for row in result["rows"]:
        print(f"{row['variant']:20} main {row['main_ms']:.1f} ms, {args.label} {row[f'{args.label}_ms']:.1f} ms: "
              f"{row['main_over_baseline']:.3f}x over {row['repeats']} repeats", flush=True)
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
