"""Python's collector at its default young threshold vs `dflashx.track.collector.YOUNG_THRESHOLD`, on the imports a
`dflashx run` process makes (torch, transformers' Qwen3 modeling code, DeepSpeed, datasets, matplotlib).

    python -m benchmarks.collector [--repeats 4]

Each repeat starts two fresh processes, one per threshold, in alternating order; each imports the libraries and
reports the imports' wall and CPU time, the collections per generation and its peak RSS. Medians go to
benchmarks/results/collector.json with the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from dflashx.store.atomic import atomic_write_text
from dflashx.track.collector import YOUNG_THRESHOLD

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "benchmarks" / "results" / "collector.json"
CHILD = """
import gc, json, resource, sys, time
gc.set_threshold(int(sys.argv[1]), *gc.get_threshold()[1:])
wall, cpu = time.perf_counter(), time.process_time()
import torch, transformers, deepspeed, datasets, matplotlib.pyplot
import transformers.models.qwen3.modeling_qwen3
print(json.dumps({"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
                  "collections": [g["collections"] for g in gc.get_stats()],
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def once(threshold: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(threshold)], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    default = 700  # CPython 3.11 and 3.12's young threshold (3.13: 2,000)
    load = os.getloadavg()[0]
    runs: dict[int, list[dict[str, float]]] = {default: [], YOUNG_THRESHOLD: []}
    for i in range(args.repeats):
        for threshold in (default, YOUNG_THRESHOLD) if i % 2 == 0 else (YOUNG_THRESHOLD, default):
            runs[threshold].append(once(threshold))
            print(threshold, {k: (round(v, 2) if isinstance(v, float) else v) for k, v in runs[threshold][-1].items()})
    median = {str(t): {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s", "peak_rss_mib")}
              for t, rs in runs.items()}
    ratio = median[str(default)]["cpu_s"] / median[str(YOUNG_THRESHOLD)]["cpu_s"]
    print(f"{'threshold':>10} {'wall s':>7} {'cpu s':>7} {'peak RSS MiB':>13}")
    for t, m in median.items():
        print(f"{t:>10} {m['wall_s']:7.2f} {m['cpu_s']:7.2f} {m['peak_rss_mib']:13.0f}")
    print(f"CPU time at {default} / at {YOUNG_THRESHOLD}: {ratio:.2f}x")
    result = {"median": median, "runs": {str(t): rs for t, rs in runs.items()}, "cpu_ratio": ratio,
              "repeats": args.repeats, "cpu_count": os.cpu_count(), "load_avg_1m_before": load,
              "python": platform.python_version(), "machine": platform.machine(),
              "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_text(RESULT, json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
