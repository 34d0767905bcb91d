"""Achievable memory bandwidth and dense GEMM rate of one GPU, and its memory as the driver reports it.

Usage (on a GPU machine): python -m benchmarks.device_ceilings [--out PATH]
Prints a table and writes benchmarks/results/device_ceilings.json. The serving model's engine
table (dflashx/plan/estimates/engine.py) cites the copy-bandwidth fraction measured here: the
share of the datasheet bandwidth that a plain device-to-device copy reaches (bytes read + written).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "benchmarks" / "results" / "device_ceilings.json"


def cuda_median_s(fn, runs: int = 20, warmup: int = 3) -> float:
    """Median seconds of `fn` on the current CUDA stream (events), after `warmup` calls."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def copy_bandwidth(gib: float = 4.0) -> float:
    """Bytes read + written per second by a device-to-device copy of `gib` GiB."""
    import torch

    n = int(gib * 2**30)
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = cuda_median_s(lambda: dst.copy_(src))
    return 2 * n / seconds


def read_bandwidth(gib: float = 4.0) -> float:
    """Bytes read per second by a sum over `gib` GiB of bf16."""
    import torch

    x = torch.empty(int(gib * 2**30) // 2, dtype=torch.bfloat16, device="cuda").normal_()
    return x.numel() * 2 / cuda_median_s(lambda: x.sum())


def gemm_flops(size: int = 8192) -> float:
    import torch

    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    seconds = cuda_median_s(lambda: a @ b, runs=10)
    return 2 * size**3 / seconds


def driver_memory_mib() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=True).stdout
        return int(out.split()[0])
    except (OSError, subprocess.CalledProcessError, ValueError, IndexError):
        return None


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    bw = copy_bandwidth()
    read = read_bandwidth()
    flops = gemm_flops()
    result = {
        "device": props.name, "torch": torch.__version__,
        "memory_total_bytes_torch": props.total_memory, "memory_total_mib_nvidia_smi": driver_memory_mib(),
        "copy_bandwidth_bytes_per_s": bw, "read_bandwidth_bytes_per_s": read, "bf16_gemm_flops": flops,
    }
    for key, value in result.items():
        print(f"{key:32} {value}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
