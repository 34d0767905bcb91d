"""The eval stage's decoder on one GPU: seconds per output token at batch 1, and the share of the datasheet
memory bandwidth that gives (what `dflashx/plan/estimates/host.py` EVAL_BANDWIDTH_EFFICIENCY states for
the eval stage's and the held-out τ probe's time).

Random bf16 targets of a published shape (benchmarks/train_step.py SHAPES) with `--layers` decoder layers,
built on the GPU; two decoders, each over the same random prompt of `--prompt` tokens for `--tokens` new
tokens, greedy:
  spec     `SpecDecoder` with an untrained DFlash drafter of the trainer's build (block `--block`, 1 layer):
           it accepts next to nothing, so one cycle (a drafter block and a verify forward of the block) per
           token: the τ-1 upper bound the planner prices;
  greedy   plain `model.generate` (KV cache), the target alone.
efficiency = the target's weight bytes (every parameter, bf16) / (datasheet bandwidth x seconds per token),
as host.batch1_seconds_per_token prices it. Each row is the fastest of `--repeats` decodes after one warm-up.

Usage (on a GPU machine): python -m benchmarks.eval_decode [--shape qwen3-32b-dense] [--layers 16 32 64]
Prints a row per depth as it finishes; writes benchmarks/results/eval_decode.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks.step_parts import build_target
from benchmarks.train_step import SHAPES, make_job
from dflashx.config.load import load_profile
from dflashx.dflash.spec_decode import SpecDecoder
from dflashx.dflash.trainer import build_drafter

RESULT = Path(__file__).resolve().parent / "results" / "eval_decode.json"
PROFILES = {"H200": "h200_x1", "H100": "h100_x8"}  # datasheet bandwidth per GPU (profiles: hardware facts)


def bandwidth_bps() -> tuple[float, str]:
    name = torch.cuda.get_device_name()
    profile = next(p for key, p in PROFILES.items() if key in name)
    gpu = load_profile(profile).gpu
    assert gpu is not None
    return gpu.bandwidth_tbs * 1e12, profile


def fastest(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def row(shape_name: str, layers: int, args: argparse.Namespace, bandwidth: float) -> dict[str, Any]:
    shape = SHAPES[shape_name]
    torch.manual_seed(0)
    target = build_target(shape, layers, "cuda", torch.bfloat16)
    weight_bytes = sum(p.numel() * p.element_size() for p in target.parameters())
    job_args = argparse.Namespace(drafter_layers=1, block=args.block, target_layers=layers, anchors=64, seq=1024)
    with tempfile.TemporaryDirectory() as stage:
        job = make_job(shape_name, shape, target, job_args, {}, stage)
        with torch.device("cuda"):
            drafter = build_drafter(job, target.config).to(torch.bfloat16)
    decoder = SpecDecoder(target, drafter)
    prompt = torch.randint(0, shape["vocab_size"] - 2, (args.prompt,), generator=torch.Generator().manual_seed(1))
    ids = prompt.tolist()
    cycles: list[int] = []

    def spec() -> None:
        result = decoder.generate(ids, args.tokens)
        cycles.append(len(result.accepted))

    def greedy() -> None:
        target.generate(prompt[None].cuda(), max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False,
                        pad_token_id=0)

    out: dict[str, Any] = {"shape": shape_name, "layers": layers, "weight_bytes": weight_bytes,
                           "prompt": args.prompt, "tokens": args.tokens, "block": args.block}
    for name, fn in (("spec", spec), ("greedy", greedy)):
        per_token = fastest(fn, args.repeats) / args.tokens
        out[name] = {"seconds_per_token": per_token, "efficiency": weight_bytes / (bandwidth * per_token)}
    out["spec"]["cycles"] = cycles[-1]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=list(SHAPES), default="qwen3-32b-dense")
    p.add_argument("--layers", type=int, nargs="+", default=[16, 32, 64])
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULT)
    args = p.parse_args(argv)
    import transformers

    bandwidth, profile = bandwidth_bps()
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "profile": profile, "bandwidth_bps": bandwidth,
                              "torch": torch.__version__, "transformers": transformers.__version__,
                              "python": sys.version.split()[0], "rows": []}
    print(f"{result['device']} ({profile}: {bandwidth / 1e12:.2f} TB/s datasheet)")
    print(f"{'shape':18} {'layers':>6} {'GB':>6} {'spec ms/tok':>11} {'eff':>6} {'cycles':>6} {'greedy ms/tok':>13} "
          f"{'eff':>6}", flush=True)
    for layers in args.layers:
        r = row(args.shape, layers, args, bandwidth)
        torch.cuda.empty_cache()  # the row's target and drafter are gone with its frame
        result["rows"].append(r)
        print(f"{args.shape:18} {layers:6} {r['weight_bytes'] / 1e9:6.1f} {r['spec']['seconds_per_token'] * 1e3:11.2f} "
              f"{r['spec']['efficiency']:6.3f} {r['spec']['cycles']:6} {r['greedy']['seconds_per_token'] * 1e3:13.2f} "
              f"{r['greedy']['efficiency']:6.3f}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
