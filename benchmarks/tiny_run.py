"""The tiny recipe's plan against a real run of it on this machine, and its pilot.

    python -m benchmarks.tiny_run                      # run recipes/tiny.yaml cold in a temporary folder
    python -m benchmarks.tiny_run --from RUN_DIR       # read a finished run of it instead
    python -m benchmarks.tiny_run --pilot              # also `dflashx pilot recipes/tiny.yaml`
    python -m benchmarks.tiny_run --from RUN_DIR --tolerance 1.25 --out F   # a GPU run (issue 38: +-25%)

Cold: a new run folder, an empty dflashx cache (`DFLASHX_CACHE`) and torch-extensions folder, as
benchmarks/cold_start.py. Prints, per stage, the plan's seconds (the run's own plan.json: work and fixed
costs) next to the measured duration (records.jsonl's stage_end) and their ratio, flags every stage
whose ratio is outside [1/2, 2] and exits 1 when any is (the acceptance of issue 22), and
the trainer's MFU windows (`train/logs/metrics.jsonl`: useful FLOP/s of the one FLOP model over the
cpu profile's `cpu_tflops`), whose median is the CPU row of the planner's MFU table
(`dflashx/plan/estimates/mfu.py`). With `--pilot`, the pilot's estimate-vs-measured figures.
Writes benchmarks/results/tiny_run.json. Other processes on the same cores slow every figure down,
two intra-op threads most of all (a thread waits on its descheduled sibling): on a shared machine
run it with OMP_NUM_THREADS=1. The JSON keeps the load average and that setting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dflashx.store.atomic import atomic_write_text

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "benchmarks" / "results" / "tiny_run.json"
RECIPE = REPO / "recipes" / "tiny.yaml"


TOLERANCE = 2.0  # every stage's measured / planned seconds within [1/2, 2]


def dflashx(*args: str, cwd: Path) -> float:
    """Run the CLI cold (empty caches under `cwd`); its wall time (raises on a failure)."""
    start = time.perf_counter()
    env = {**os.environ, "DFLASHX_CACHE": str(cwd / "cache"), "TORCH_EXTENSIONS_DIR": str(cwd / "ext")}
    proc = subprocess.run([sys.executable, "-m", "dflashx.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, check=False)
    if proc.returncode:
        raise SystemExit(f"dflashx {' '.join(args)} exited {proc.returncode}:\n"
                         f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def read_run(run: Path, tolerance: float = TOLERANCE) -> dict[str, Any]:
    plan = json.loads((run / "plan.json").read_text())
    planned = {s["name"]: s["estimates"]["seconds"] for s in plan["stages"] if s["enabled"]}
    ends = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    measured = {r["stage"]: r["duration_s"] for r in ends if r.get("event") == "stage_end"}
    rows = [json.loads(line) for line in (run / "train/logs/metrics.jsonl").read_text().splitlines()]
    mfu = [w["mfu"] for w in rows if "mfu" in w]  # the held-out τ rows between the training windows have none
    provenance = json.loads((run / "train/provenance.json").read_text())
    return {
        "run_dir": str(run), "commit": provenance["dflashx"]["git"],
        "stages": {n: compare(planned[n], measured.get(n), tolerance) for n in planned},
        "train_mfu": {"windows": len(mfu), "median": statistics.median(mfu), "min": min(mfu), "max": max(mfu),
                      "reference_tflops": plan["resolved"]["stages"]["train"]["peak_flops"] / 1e12},
    }


def compare(planned: float, measured: float | None, tolerance: float = TOLERANCE) -> dict[str, Any]:
    """One stage: planned and measured seconds, measured / planned, and whether that is within `tolerance`
    (a ratio, e.g. 2: [1/2, 2])."""
    ratio = measured / planned if measured is not None and planned > 0 else None
    return {"planned_s": planned, "measured_s": measured, "ratio": ratio,
            "within": ratio is not None and 1 / tolerance <= ratio <= tolerance}


def pilot(folder: Path) -> dict[str, Any]:
    run = folder / "pilot-run"
    wall = dflashx("pilot", str(RECIPE), "--run-dir", str(run), "--skip-preflight", cwd=folder)
    cal = json.loads((run / "pilot" / "calibration.json").read_text())
    m = cal["measured"]
    return {"wall_s": wall, "load_avg_1m": os.getloadavg()[0], "seconds": m["seconds"], "samples": m["samples"],
            "lengths": m["lengths"],
            "generation": m["generation"], "training": m["training"],
            "serving_ratio": cal["serving_ratio"], "training_mfu": cal["training_mfu"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="run", type=Path, help="a finished run of recipes/tiny.yaml")
    parser.add_argument("--pilot", action="store_true", help="also run `dflashx pilot` on the tiny recipe")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="measured / planned within [1/T, T]")
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args()
    tolerance = args.tolerance
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        run = args.run
        wall = None
        before = None
        if run is None:
            run, before = folder / "tiny", os.getloadavg()[0]
            wall = dflashx("run", str(RECIPE), "--run-dir", str(run), cwd=folder)
        load = os.getloadavg()[0] if wall is not None else None  # a run read --from ran at another time
        result = {"cpu_count": os.cpu_count(), "load_avg_1m_before": before, "load_avg_1m": load, "run_wall_s": wall,
                  "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                  "tolerance": tolerance, **read_run(run.resolve(), tolerance)}
        if args.pilot:
            result["pilot"] = pilot(folder)
    busy = max(x for x in (result["load_avg_1m_before"], result["load_avg_1m"], 0.0) if x is not None)
    if busy > 0.5:
        print(f"note: load average {busy:.1f} on {os.cpu_count()} cores: other processes lengthen every measured "
              "time; the 2x check is meant for idle cores")
    print(f"{'stage':10} {'planned s':>10} {'measured s':>11} {'ratio':>7}")
    for name, s in result["stages"].items():
        ratio = f"{s['ratio']:7.2f}" if s["ratio"] is not None else f"{'-':>7}"
        print(f"{name:10} {s['planned_s']:10.2f} {s['measured_s'] or 0:11.2f} {ratio}"
              f"{'' if s['within'] else f'  OUTSIDE {tolerance:g}x'}")
    m = result["train_mfu"]
    print(f"train MFU over {m['windows']} windows: median {m['median']:.3f} (min {m['min']:.3f}, max {m['max']:.3f}) "
          f"of {m['reference_tflops']:g} TFLOP/s")
    if "pilot" in result:
        p = result["pilot"]
        print(f"pilot: {p['wall_s']:.0f} s; MFU {p['training']['mfu']:.3f} (table {p['training']['mfu_planned']:.3f}); "
              f"generation {p['generation']['measured_tokens_per_s']:.0f} tok/s "
              f"(model {p['generation']['predicted_tokens_per_s']:.0f}, ratio {p['serving_ratio']:.3f})")
    outside = [n for n, s in result["stages"].items() if not s["within"]]
    result["all_within"] = not outside
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    if outside:
        raise SystemExit(f"outside {tolerance:g}x of the plan: {', '.join(outside)}")


if __name__ == "__main__":
    main()
