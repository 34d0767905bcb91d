"""The product's DFlash training step at real layer shapes, beside the naive step: ms, MFU, memory.

Targets have the real per-layer shapes of Qwen3-32B (dense) and Qwen3.6-27B (qwen3_5 text: Gated
DeltaNet 3:1 with full attention), random weights and fewer layers (`--target-layers`), so the step
fits one GPU; the tapped layers follow the DFlash spread over that many layers. The drafter is the
5-layer DFlash drafter at the target's width. Per shape, in one process:

- naive:    HF `output_hidden_states=True` over all layers plus the target's logits, the drafter's
            attention dense over every context and block key (materialised mask, SDPA),
            full-vocabulary logits for every block slot, plain AdamW on bf16 weights;
- trainer:  `dflashx.dflash.step.TrainStep` — the DeepSpeed engine `run_training` builds, from a
            resolved recipe (one-GPU H200 profile, ZeRO 2), stepped on the same batch; one row per
            recipe variant (`VARIANTS`: eager with the torch loss; the GPU defaults — compiled drafter,
            liger loss —; the same after two other lengths (`--vary`); the torch loss; bf16 master
            weights; `drafter.precision: fp8`; then `target.precision: fp8` too; DFlash2, eager and with
            the defaults).
Useful FLOPs (`dflashx.dflash.metrics.step_flops`, the one FLOP model) divide every row's time, so
the naive step's extra work counts as waste; MFU is against a bf16 8192^3 matmul measured first.
`--curve-steps N` then trains N steps on a learnable synthetic stream with a bf16 and an fp8 drafter
(same seed, data and schedule) and compares the loss curves.

    python -m benchmarks.train_step                     # both shapes and the curves, on the GPU
    python -m benchmarks.train_step --tiny              # small shapes on CPU (a smoke test)
Each row is printed as it completes and the JSON (benchmarks/results/train_step.json, _tiny with
--tiny, or --out) is rewritten after every row, so a killed run keeps what it measured.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

# run as a script, Python puts benchmarks/ first on sys.path, where benchmarks/tokenize.py would shadow
# the standard library's tokenize: put the repository root there instead
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from benchmarks.shapes import SHAPES, shape_of
from benchmarks.step_parts import NaiveStep, sync, build_target, matmul_peak, random_batch, timed
from dflashx.dflash.distributed import setup_distributed
from dflashx.dflash.fp8 import target_to_fp8
from dflashx.dflash.job import TrainJob
from dflashx.dflash.metrics import step_flops
from dflashx.dflash.step import TrainStep
from dflashx.dflash.trainer import build_drafter

RESULTS = Path(__file__).resolve().parent / "results" / "train_step.json"
# trainer rows: (name, recipe overrides); `target.precision: fp8` converts the target in place: last.
# "varying lengths" (--vary) first steps two other lengths, so the timed graphs are the dynamic-shape
# ones a run over real data settles on.
VARY = "trainer, varying lengths"
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("trainer eager", {"stages": {"train": {"compile": False, "loss_kernel": "torch"}}}),
    ("trainer", {}),
    (VARY, {}),
    ("trainer, torch loss", {"stages": {"train": {"loss_kernel": "torch"}}}),
    ("trainer, bf16 master", {"stages": {"train": {"master_weights": "bf16"}}}),
    ("trainer, fp8 drafter", {"drafter": {"precision": "fp8"}}),
    ("trainer, fp8 drafter + target", {"drafter": {"precision": "fp8"}, "target": {"precision": "fp8"}}),
    # DFlash2 (the published keys' defaults: convolutions of 2 taps over groups of 16, selector rank 256, top-16)
    # beside DFlash's rows above: `--variants "trainer eager" "trainer eager, dflash2" trainer "trainer, dflash2"`
    ("trainer eager, dflash2", {"drafter": {"architecture": "dflash2"},
                                "stages": {"train": {"compile": False, "loss_kernel": "torch"}}}),
    ("trainer, dflash2", {"drafter": {"architecture": "dflash2"}}),
]


def code_of(package: str) -> SimpleNamespace:
    """What a trainer row calls, from `package`: `dflashx`, or an older checkout imported under another
    name (`benchmarks/train_step_vs.py`)."""
    mod = importlib.import_module
    return SimpleNamespace(
        load_profile=mod(f"{package}.config.load").load_profile, merge=mod(f"{package}.config.tree").merge,
        Recipe=mod(f"{package}.config.schema").Recipe, resolve=mod(f"{package}.resolve").resolve,
        spread_layer_ids=mod(f"{package}.resolve.formulas").spread_layer_ids,
        facts_from_config=mod(f"{package}.targets.read_config").facts_from_config,
        TrainJob=mod(f"{package}.dflash.job").TrainJob, build_drafter=mod(f"{package}.dflash.trainer").build_drafter,
        TrainStep=mod(f"{package}.dflash.step").TrainStep)


def make_job(name: str, shape: dict[str, Any], target: nn.Module, args, overrides: dict[str, Any],
             stage_dir: str, code: SimpleNamespace | None = None) -> TrainJob:
    """The TrainJob the train stage of `code` (default: this checkout's) would build for this shape and
    variant (resolved recipe)."""
    code = code or code_of("dflashx")
    load_profile, merge, spread_layer_ids = code.load_profile, code.merge, code.spread_layer_ids
    hardware = load_profile("h200_x1").model_dump() if torch.cuda.is_available() else {"name": "cpu", "cpu_tflops": 0.1}
    recipe = merge({
        "name": name, "dataset": {"sources": [{"name": "random", "path": "unused.jsonl"}]},
        "target": {"model": name}, "hardware": hardware,
        "drafter": {"num_layers": args.drafter_layers, "block_size": args.block,
                    "mask_token_id": shape["mask_token_id"],
                    "target_layer_ids": spread_layer_ids(args.target_layers, 5)},
        # `compile: true`: a real run's steps pay for the compile (`auto` compiles when they do,
        # dflashx.resolve.compile_rule), a benchmark's few never would
        "stages": {"train": {"zero_stage": 2, "anchors_per_seq": args.anchors, "max_length": args.seq,
                             "compile": True}}}, overrides)
    facts = code.facts_from_config(target.config.to_dict(), name=name)
    resolved = code.resolve(code.Recipe.model_validate(recipe), facts)
    return code.TrainJob.of(resolved, stage_dir, "-", "-", "-")


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _graphs() -> int:
    """Graphs dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _row(name: str, fn: Callable[[], Any], flops: float, tokens: int, peak: float | None, args) -> dict[str, Any]:
    try:
        first, seconds = timed(fn, args.warmup, args.iters)
    except torch.OutOfMemoryError as exc:
        return {"variant": name, "error": f"out of memory: {str(exc).splitlines()[0]}"}
    tflops = flops / seconds / 1e12
    return {"variant": name, "step_s": seconds, "first_call_s": first, "tokens_per_s": tokens / seconds,
            "useful_tflops": tflops, "mfu": tflops / peak if peak else None,
            "peak_memory_gb": torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None}


def _print_row(shape: str, r: dict[str, Any], naive_s: float | None) -> None:
    if "error" in r:
        print(f"{shape:20} {r['variant']:32} {r['error']}", flush=True)
        return
    mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
    mem = f"{r['peak_memory_gb']:.1f}" if r["peak_memory_gb"] is not None else "-"
    speed = f"{naive_s / r['step_s']:.2f}x" if naive_s else "-"
    print(f"{shape:20} {r['variant']:32} {r['step_s'] * 1e3:8.1f} {r['useful_tflops']:8.1f} {mfu:>6} {mem:>7} "
          f"{speed:>7} {r['first_call_s']:7.1f}", flush=True)


def run_shape(name: str, shape: dict[str, Any], args, device: str, peaks: dict[str, float | None],
              save: Callable[[], None], result: dict[str, Any]) -> None:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    target = build_target(shape, args.target_layers, device, dtype)
    batch = random_batch(shape["vocab_size"], args.seq)
    with tempfile.TemporaryDirectory() as stage:
        job = make_job(name, shape, target, args, {}, stage)
        naive = NaiveStep(target, job, batch, device)
        flops = step_flops(job.target.facts, naive.cfg, [args.seq], naive.blocks)
        result.update({"shape": name, "target_layers": args.target_layers, "tapped": job.drafter.target_layer_ids,
                       "drafter_layers": args.drafter_layers, "seq": args.seq,
                       "anchors": int((naive.blocks.anchors >= 0).sum()),
                       "block": args.block, "useful_tflop_per_step": flops / 1e12, "rows": []})
        _free()
        row = _row("naive", naive, flops, args.seq, peaks["bf16"], args)
        del naive
        result["rows"].append(row)
        naive_s = row.get("step_s")
        _print_row(name, row, None)
        save()
        for variant, overrides in VARIANTS:
            if "target" in overrides and (not peaks["fp8"] or args.no_fp8):
                continue
            fp8_drafter = overrides.get("drafter", {}).get("precision") == "fp8"
            if (fp8_drafter and args.no_fp8) or (variant == VARY and not args.vary):
                continue
            if args.variants and variant not in args.variants:
                continue
            job = make_job(name, shape, target, args, overrides, stage)
            if job.target.precision == "fp8":
                target_to_fp8(target, torch.device(device), depth=max(job.drafter.target_layer_ids) + 1)
            torch._dynamo.reset()  # each row compiles as a training process does: one drafter per process
            _free()
            with torch.device(device):
                drafter = build_drafter(job, target.config)
            trainer = TrainStep(job, target, drafter, 1000, torch.device(device))
            graphs = _graphs()
            if variant == VARY:
                for i, length in enumerate((args.seq * 3 // 4 + 5, args.seq // 2 + 3)):
                    trainer.step(random_batch(shape["vocab_size"], length, seed=i + 1), 0)
            row = _row(variant, lambda trainer=trainer: trainer.step(batch, 0), flops, args.seq, peaks["bf16"], args)
            row["graphs_compiled"] = _graphs() - graphs
            row |= {"kernels": trainer.kernels,
                    "speedup_vs_naive": naive_s / row["step_s"] if naive_s and "step_s" in row else None}
            trainer.engine.destroy()
            trainer = drafter = None  # frees the engine before the next row builds one
            result["rows"].append(row)
            _print_row(name, row, naive_s)
            save()


def markov_batches(vocab: int, seq: int, steps: int, seed: int = 0, ids: int = 4096) -> list[dict[str, torch.Tensor]]:
    """A learnable stream: each token is a fixed random successor of the previous one 90% of the
    time, else random (over `ids` token ids), so the loss falls gradually over a few hundred steps."""
    g = torch.Generator().manual_seed(seed)
    ids = min(ids, vocab - 2)
    successor = torch.randperm(ids, generator=g)
    out = []
    for i in range(steps):
        row = torch.empty(seq, dtype=torch.long)
        row[0] = torch.randint(0, ids, (1,), generator=g)
        noise = torch.rand(seq, generator=g) < 0.1
        rand = torch.randint(0, ids, (seq,), generator=g)
        for t in range(1, seq):
            row[t] = rand[t] if noise[t] else successor[row[t - 1]]
        batch = random_batch(vocab, seq, seed=i)
        batch["input_ids"] = row[None]
        out.append(batch)
    return out


def loss_curves(args, device: str, save: Callable[[], None], result: dict[str, Any]) -> None:
    """`--curve-steps` steps with a bf16 and an fp8 drafter on the same stream; compare the losses."""
    name = "qwen3-32b-dense"
    shape = shape_of(name, args.tiny)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    target = build_target(shape, args.target_layers, device, dtype)
    batches = markov_batches(shape["vocab_size"], args.curve_seq, args.curve_steps)
    result.update({"shape": name, "steps": args.curve_steps, "seq": args.curve_seq, "anchors": args.curve_anchors,
                   "data": "first-order Markov stream: fixed successor 90%, random 10%, 4096 ids", "losses": {}})
    curve_args = argparse.Namespace(**(vars(args) | {"anchors": args.curve_anchors, "seq": args.curve_seq}))
    for precision in ("bf16", "fp8"):
        with tempfile.TemporaryDirectory() as stage:
            job = make_job(name, shape, target, curve_args, {"drafter": {"precision": precision}}, stage)
            torch._dynamo.reset()
            _free()
            with torch.device(device):
                drafter = build_drafter(job, target.config)
            trainer = TrainStep(job, target, drafter, args.curve_steps, torch.device(device))
            t0, losses = time.perf_counter(), []
            for i, batch in enumerate(batches):
                losses.append(float(trainer.step(batch, 0).loss.detach()))
                if i == 9:
                    sync()
                    t0 = time.perf_counter()
            result["losses"][precision] = losses
            result[f"{precision}_step_s"] = (time.perf_counter() - t0) / max(len(batches) - 10, 1)
            trainer.engine.destroy()
            del trainer, drafter
        print(f"curve {precision}: loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
              f"{result[f'{precision}_step_s'] * 1e3:.1f} ms/step", flush=True)
        save()
    tail = max(1, min(20, args.curve_steps // 4))
    a, b = (sum(result["losses"][p][-tail:]) / tail for p in ("bf16", "fp8"))
    result["last_steps_mean"] = {"steps": tail, "bf16": a, "fp8": b, "relative_difference": (b - a) / a}
    result["fp8_speedup"] = result["bf16_step_s"] / result["fp8_step_s"]
    print(f"curve: mean loss of the last {tail} steps bf16 {a:.4f}, fp8 {b:.4f} ({(b - a) / a:+.2%}); "
          f"fp8 step {result['fp8_speedup']:.2f}x bf16", flush=True)
    save()


def environment(device: str) -> dict[str, Any]:
    import transformers

    versions = {}
    for name in ("deepspeed", "torchao", "liger_kernel", "fla", "triton"):
        try:
            versions[name] = getattr(__import__(name), "__version__", "?")
        except ImportError:
            versions[name] = None
    return {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
            "causal_conv1d": importlib.util.find_spec("causal_conv1d") is not None, **versions}


def add_step_args(p: argparse.ArgumentParser) -> None:
    """The target, batch and timing arguments a trainer row is built and timed with (here and in
    benchmarks/train_step_vs.py)."""
    p.add_argument("--tiny", action="store_true", help="small shapes (CPU smoke test)")
    p.add_argument("--target-layers", type=int, default=16)
    p.add_argument("--drafter-layers", type=int, default=5)
    p.add_argument("--seq", type=int, default=3072)
    p.add_argument("--anchors", type=int, default=512)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=5)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_args(p)
    p.add_argument("--shape", choices=["all", "none", *SHAPES], default="all")
    p.add_argument("--no-fp8", action="store_true")
    p.add_argument("--vary", action="store_true", help=f"add the row '{VARY}'")
    p.add_argument("--variants", nargs="*", metavar="NAME",
                   help=f"only these trainer rows (default: all of {', '.join(v for v, _ in VARIANTS)})")
    p.add_argument("--curve-steps", type=int, default=200, help="fp8 vs bf16 loss curve steps (0: none)")
    p.add_argument("--curve-seq", type=int, default=1024)
    p.add_argument("--curve-anchors", type=int, default=128)
    p.add_argument("--out", type=Path, help=f"default {RESULTS.name} ({RESULTS.stem}_tiny.json with --tiny)")
    args = p.parse_args(argv)
    if args.tiny:
        args.target_layers, args.drafter_layers = min(args.target_layers, 6), min(args.drafter_layers, 2)
        args.seq, args.anchors, args.block = min(args.seq, 96), min(args.anchors, 12), min(args.block, 4)
        args.curve_steps, args.curve_seq, args.curve_anchors = min(args.curve_steps, 12), 64, 8
        args.warmup, args.iters = 1, 1
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    setup_distributed()
    size = 512 if args.tiny else 8192
    peaks = {"bf16": matmul_peak(device, size, fp8=False),
             "fp8": matmul_peak(device, size, fp8=True) if device == "cuda" else None}
    out = args.out or RESULTS.with_name(f"{RESULTS.stem}_tiny.json" if args.tiny else RESULTS.name)
    report = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "environment": environment(device), "peak_tflops": peaks, "results": [], "curve": {}}

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        os.replace(tmp, out)

    print(f"measured peaks: bf16 {peaks['bf16'] or 0:.1f} TFLOP/s, fp8 {peaks['fp8'] or 0:.1f} TFLOP/s", flush=True)
    print(f"{'shape':20} {'variant':32} {'step ms':>8} {'TFLOP/s':>8} {'MFU':>6} {'mem GB':>7} {'vs naive':>7} "
          f"{'first s':>7}", flush=True)
    names = {"all": list(SHAPES), "none": []}.get(args.shape, [args.shape])
    for name in names:
        result: dict[str, Any] = {}
        report["results"].append(result)
        run_shape(name, shape_of(name, args.tiny), args, device, peaks, save, result)
        _free()
    if args.curve_steps:
        loss_curves(args, device, save, report["curve"])
    save()
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
