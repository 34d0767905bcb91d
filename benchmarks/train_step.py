"""One DFlash training step at real layer shapes: useful TFLOP/s, MFU, memory; optimized vs naive.

Targets have the real per-layer shapes of Qwen3-32B (dense) and Qwen3.6-27B (qwen3_5 text: Gated
DeltaNet 3:1 with full attention), random weights and fewer layers (`--target-layers`), so the
step fits one GPU; the tapped layers follow the DFlash spread over that many layers. The drafter
is the 5-layer DFlash drafter at the target's width. Per shape, in the same process:

- peak:      a bf16 (and fp8, where `torch._scaled_mm` runs) matmul measured now: the MFU reference;
- optimized: target forward stopped after the deepest tapped layer (hooks, no output_hidden_states,
             no LM head), drafter with per-anchor block masks (flex attention on CUDA), LM head
             only on supervised slots, chunked; drafter fwd + bwd + AdamW step;
- fp8:       the same with the frozen target's linear layers in FP8 (dflashx.dflash.fp8, as training
             runs it for `target.precision: fp8`);
- naive:     target with output_hidden_states=True over all layers and its full logits, drafter
             attention dense over all context + block keys (materialised mask), full-vocabulary
             logits for every block slot.
Useful FLOPs (dflashx.dflash.metrics): target forward up to the deepest tapped layer, drafter
forward + backward with attention only over the keys each query may see, LM head on supervised
slots; the same count divides every variant's time, so the naive step's extra work is waste.

    python -m benchmarks.train_step                 # both shapes on the GPU
    python -m benchmarks.train_step --tiny          # small shapes on CPU (a smoke test)
Writes benchmarks/results/train_step.json (train_step_tiny.json with --tiny, or --out) and prints a table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# run as a script, Python puts benchmarks/ first on sys.path, where benchmarks/tokenize.py would shadow
# the standard library's tokenize: put the repository root there instead
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from dflashx.dflash.anchors import build_block_batch
from dflashx.config.schema import Recipe
from dflashx.dflash.capture import FeatureCapture
from dflashx.dflash.config import DFlashConfig
from dflashx.dflash.fp8 import target_to_fp8
from dflashx.dflash.loss import dflash_loss
from dflashx.dflash.masks import DraftMask
from dflashx.dflash.metrics import step_flops
from dflashx.dflash.model import DFlashDrafter
from dflashx.resolve import ResolvedRecipe, resolve
from dflashx.resolve.formulas import spread_layer_ids
from dflashx.targets.read_config import facts_from_config

RESULTS = Path(__file__).resolve().parent / "results" / "train_step.json"
_LINEAR = {"linear_conv_kernel_dim": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
           "linear_key_head_dim": 128, "linear_value_head_dim": 128}
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-32b-dense": {"model_type": "qwen3", "hidden_size": 5120, "num_attention_heads": 64,
                        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 25600,
                        "vocab_size": 151936, "mask_token_id": 151669},
    "qwen3.6-27b-hybrid": {"model_type": "qwen3_5_text", "hidden_size": 5120, "num_attention_heads": 24,
                           "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 17408,
                           "vocab_size": 248320, "mask_token_id": 248070, **_LINEAR},
}
TINY = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 128, "vocab_size": 512, "mask_token_id": 511, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16}


def build_target(shape: dict[str, Any], layers: int, device: str, dtype: torch.dtype) -> nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    fields = {k: v for k, v in shape.items() if k not in ("model_type", "mask_token_id")}
    common = dict(num_hidden_layers=layers, max_position_embeddings=65536, tie_word_embeddings=False, **fields)
    if shape["model_type"] == "qwen3":
        config = Qwen3Config(**common)
        cls = Qwen3ForCausalLM
    else:
        types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
        config = Qwen3_5TextConfig(layer_types=types, **common)
        cls = Qwen3_5ForCausalLM
    with torch.device(device):
        model = cls(config).to(dtype)
    return model.eval().requires_grad_(False)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], warmup: int, iters: int) -> float:
    """Mean seconds per call after `warmup` calls."""
    for _ in range(warmup):
        fn()
    _sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync()
    return (time.perf_counter() - t0) / iters


def matmul_peak(device: str, n: int, fp8: bool) -> float | None:
    """Achieved TFLOP/s of an n x n x n matmul in bf16 (or fp8 via _scaled_mm); None if unsupported."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    if fp8:
        one = torch.ones((), device=device)
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t().contiguous().t()
        fn = lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        fn = lambda: a @ b
    try:
        seconds = timed(fn, 3, 20 if device == "cuda" else 2)
    except (RuntimeError, TypeError):
        return None
    return 2 * n**3 / seconds / 1e12


class Step:
    """One training step's tensors and the two ways of running it."""

    def __init__(self, target: nn.Module, drafter: DFlashDrafter, recipe: ResolvedRecipe, seq: int, anchors: int,
                 device: str, seed: int = 0):
        cfg = drafter.config
        g = torch.Generator().manual_seed(seed)
        self.target, self.drafter, self.cfg, self.facts = target, drafter, cfg, recipe.target.facts
        self.input_ids = torch.randint(0, cfg.vocab_size - 2, (1, seq), generator=g)
        loss_mask = torch.ones(1, seq, dtype=torch.long)
        loss_mask[:, : seq // 8] = 0  # a prompt without loss
        valid = torch.nonzero(loss_mask[0, :-1].bool() & loss_mask[0, 1:].bool()).flatten()
        picked = valid[torch.randperm(len(valid), generator=g)[:anchors]].sort().values
        self.batch = build_block_batch(self.input_ids, loss_mask, [picked], cfg.block_size, cfg.mask_token_id,
                                       recipe.stages.train.loss_gamma).to(device)
        self.input_ids = self.input_ids.to(device)
        self.capture = FeatureCapture(target, cfg.target_layer_ids)
        self.embed = target.get_input_embeddings()
        self.head = target.get_output_embeddings().weight
        self.ctx_pos = torch.arange(seq, device=device)[None]
        self.opt = torch.optim.AdamW(drafter.parameters(), lr=1e-5, fused=device == "cuda")

    def useful_flops(self) -> float:
        """The one FLOP model (dflashx.resolve.flops), as the trainer and the planner count."""
        return step_flops(self.facts, self.cfg, [self.input_ids.shape[1]], self.batch)

    def _train(self, features: torch.Tensor, mask: DraftMask, full_logits: bool) -> torch.Tensor:
        d, b = self.drafter, self.batch
        hidden = d(self.embed(b.block_ids), d.fuse(features), b.block_positions, self.ctx_pos, mask)
        if full_logits:
            logits = (hidden @ self.head.t()).float()
            ce = F.cross_entropy(logits.flatten(0, 1), b.labels.flatten(), reduction="none")
            w = b.weights.flatten()
            loss = (ce * w).sum() / w.sum()
        else:
            loss = dflash_loss(hidden, self.head, b.labels, b.weights, self.cfg.block_size).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def optimized(self) -> torch.Tensor:
        with torch.no_grad():
            features = self.capture.capture(self.input_ids)
        mask = DraftMask(self.batch.anchors, self.input_ids.shape[1], self.cfg.block_size)
        return self._train(features, mask, full_logits=False)

    def naive(self) -> torch.Tensor:
        with torch.no_grad():
            out = self.target(self.input_ids, output_hidden_states=True, use_cache=False)
            features = torch.cat([out.hidden_states[i + 1] for i in self.cfg.target_layer_ids], -1)
            out.logits.float().sum()  # the target's full logits are materialised, as a naive step does
        mask = DraftMask(self.batch.anchors, self.input_ids.shape[1], self.cfg.block_size, backend="sdpa")
        return self._train(features, mask, full_logits=True)


def _measure(name: str, fn: Callable[[], Any], flops: float, tokens: int, peak: float | None, args) -> dict[str, Any]:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        seconds = timed(fn, args.warmup, args.iters)
    except torch.OutOfMemoryError as exc:
        return {"variant": name, "error": f"out of memory: {str(exc).splitlines()[0]}"}
    tflops = flops / seconds / 1e12
    return {
        "variant": name, "step_s": seconds, "tokens_per_s": tokens / seconds, "useful_tflops": tflops,
        "mfu": tflops / peak if peak else None,
        "peak_memory_gb": torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None,
    }


def profile(fn: Callable[[], Any], top: int = 18) -> None:
    """Print the kernels that take the most device time in one call of `fn`."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with torch_profile(activities=activities) as prof:
        fn()
        _sync()
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=top, max_name_column_width=60))


def run_shape(name: str, shape: dict[str, Any], args, device: str, peaks: dict[str, float | None]) -> dict[str, Any]:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    target = build_target(shape, args.target_layers, device, dtype)
    ids = spread_layer_ids(args.target_layers, 5)
    recipe = resolve(Recipe.model_validate({
        "name": name, "dataset": {"sources": [{"name": "random", "path": "unused.jsonl"}]},
        "target": {"model": name}, "hardware": {"name": "benchmark"},
        "drafter": {"num_layers": args.drafter_layers, "block_size": args.block, "target_layer_ids": ids,
                    "mask_token_id": shape["mask_token_id"]}}), facts_from_config(target.config.to_dict(), name=name))
    with torch.device(device):
        drafter = DFlashDrafter(DFlashConfig.from_target(recipe.drafter, target.config)).to(dtype)
    step = Step(target, drafter, recipe, args.seq, args.anchors, device)
    flops, tokens = step.useful_flops(), args.seq
    rows = [_measure("optimized", step.optimized, flops, tokens, peaks["bf16"], args),
            _measure("naive", step.naive, flops, tokens, peaks["bf16"], args)]
    if args.compile:
        for layer in drafter.layers:
            layer.compile()  # fuses the norms, RoPE and SwiGLU around the matmuls
        rows.append(_measure("optimized+compile", step.optimized, flops, tokens, peaks["bf16"], args))
    if peaks["fp8"] and not args.no_fp8:
        swapped = target_to_fp8(target, torch.device(device), depth=max(ids) + 1)
        label = "optimized+compile+fp8-target" if args.compile else "optimized+fp8-target"
        row = _measure(label, step.optimized, flops, tokens, peaks["bf16"], args)
        rows.append(row | {"fp8_linears": swapped})
    if args.profile:
        profile(step.optimized)
    by = {r["variant"]: r for r in rows}
    speedup = None
    if "step_s" in by["optimized"] and "step_s" in by["naive"]:
        speedup = by["naive"]["step_s"] / by["optimized"]["step_s"]
    return {
        "shape": name, "target_layers": args.target_layers, "tapped": ids, "drafter_layers": args.drafter_layers,
        "seq": args.seq, "anchors": int((step.batch.anchors >= 0).sum()), "block": args.block,
        "useful_tflop_per_step": flops / 1e12, "speedup_vs_naive": speedup, "rows": rows,
        "target_params_b": sum(p.numel() for p in target.parameters()) / 1e9,
        "drafter_params_b": sum(p.numel() for p in drafter.parameters()) / 1e9,
    }


def environment(device: str) -> dict[str, Any]:
    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
           "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
           "flash_linear_attention": importlib.util.find_spec("fla") is not None,
           "causal_conv1d": importlib.util.find_spec("causal_conv1d") is not None,
           "torchao": importlib.util.find_spec("torchao") is not None}
    return env


def print_table(results: list[dict[str, Any]], peaks: dict[str, float | None]) -> None:
    print(f"measured peaks: bf16 {peaks['bf16'] or 0:.1f} TFLOP/s, fp8 {peaks['fp8'] or 0:.1f} TFLOP/s")
    head = f"{'shape':22} {'variant':28} {'step s':>8} {'tok/s':>9} {'TFLOP/s':>8} {'MFU':>6} {'mem GB':>7}"
    print(head + "\n" + "-" * len(head))
    for res in results:
        for r in res["rows"]:
            if "error" in r:
                print(f"{res['shape']:22} {r['variant']:28} {r['error']}")
                continue
            mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
            mem = f"{r['peak_memory_gb']:.1f}" if r["peak_memory_gb"] is not None else "-"
            print(f"{res['shape']:22} {r['variant']:28} {r['step_s']:8.3f} {r['tokens_per_s']:9.0f} "
                  f"{r['useful_tflops']:8.1f} {mfu:>6} {mem:>7}")
        if res["speedup_vs_naive"]:
            print(f"{res['shape']:22} speed-up vs naive: {res['speedup_vs_naive']:.2f}x")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="small shapes (CPU smoke test)")
    p.add_argument("--shape", choices=["all", *SHAPES], default="all")
    p.add_argument("--target-layers", type=int, default=16)
    p.add_argument("--drafter-layers", type=int, default=5)
    p.add_argument("--seq", type=int, default=3072)
    p.add_argument("--anchors", type=int, default=512)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--no-fp8", action="store_true")
    p.add_argument("--profile", action="store_true", help="print the top CUDA kernels of one optimized step")
    p.add_argument("--compile", action="store_true", help="also time the step with torch.compile'd drafter layers")
    p.add_argument("--out", type=Path, help=f"default {RESULTS.name} ({RESULTS.stem}_tiny.json with --tiny)")
    args = p.parse_args(argv)
    if args.tiny:
        args.target_layers, args.drafter_layers = min(args.target_layers, 6), min(args.drafter_layers, 2)
        args.seq, args.anchors, args.block = min(args.seq, 96), min(args.anchors, 12), min(args.block, 4)
        args.warmup, args.iters = 1, 1
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    size = 512 if args.tiny else 8192
    peaks = {"bf16": matmul_peak(device, size, fp8=False),
             "fp8": matmul_peak(device, size, fp8=True) if device == "cuda" else None}
    names = list(SHAPES) if args.shape == "all" else [args.shape]
    results = []
    for name in names:
        shape = SHAPES[name] | (TINY if args.tiny else {})
        results.append(run_shape(name, shape, args, device, peaks))
        if device == "cuda":
            torch.cuda.empty_cache()
    print_table(results, peaks)
    args.out = args.out or RESULTS.with_name(f"{RESULTS.stem}_tiny.json" if args.tiny else RESULTS.name)
    report = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "environment": environment(device), "peak_tflops": peaks, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
