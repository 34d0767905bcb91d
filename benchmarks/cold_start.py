"""The front door: `dflashx run recipes/tiny.yaml` from a cold start, side by side with a warm re-run.

Cold: an empty dflashx cache (`DFLASHX_CACHE`: the tiny target, tokenizer and prompts are made
again) and an empty torch-extensions folder, in a new run folder. Warm: the same command again
in the finished run folder (every stage skipped). Each pair runs `--runs` times (median reported);
the cold runs also report the trained and untrained τ from eval.json.

Usage: python benchmarks/cold_start.py [--runs 3]
Prints a table as rows finish and writes benchmarks/results/cold_start.json
(goals: cold median <= 180 s, warm median <= 15 s, on an idle 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "benchmarks" / "results" / "cold_start.json"
GOALS_S = {"cold": 180.0, "warm": 15.0}


def timed_run(run_dir: Path, env: dict[str, str]) -> float:
    cli = shutil.which("dflashx")
    argv = [cli] if cli else [sys.executable, "-m", "dflashx.cli.main"]
    start = time.perf_counter()
    proc = subprocess.run([*argv, "run", "recipes/tiny.yaml", "--run-dir", str(run_dir)], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"dflashx run exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rows: dict[str, list[float]] = {"cold": [], "warm": []}
    taus: list[dict[str, float]] = []
    print(f"{'run':<6} {'kind':<5} {'seconds':>8}", flush=True)
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="dflashx-cold-") as tmp:
            root = Path(tmp)
            env = os.environ | {"DFLASHX_CACHE": str(root / "cache"), "TORCH_EXTENSIONS_DIR": str(root / "ext"),
                                "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
            run_dir = root / "run"
            for kind in ("cold", "warm"):
                seconds = timed_run(run_dir, env)
                rows[kind].append(seconds)
                print(f"{i + 1:<6} {kind:<5} {seconds:>8.1f}", flush=True)
            report = json.loads((run_dir / "eval" / "report" / "eval.json").read_text())
            taus.append({"trained": report["trained"]["tau"], "untrained": report["untrained"]["tau"]})
    summary = {kind: {"median_s": statistics.median(times), "runs_s": times, "goal_s": GOALS_S[kind],
                      "met": statistics.median(times) <= GOALS_S[kind]} for kind, times in rows.items()}
    print(f"\n{'kind':<5} {'median s':>9} {'goal s':>7}  met")
    for kind, s in summary.items():
        print(f"{kind:<5} {s['median_s']:>9.1f} {s['goal_s']:>7.0f}  {'yes' if s['met'] else 'NO'}")
    print(f"cold / warm: {summary['cold']['median_s'] / summary['warm']['median_s']:.1f}x; tau trained vs "
          f"untrained per cold run: {[(round(t['trained'], 2), round(t['untrained'], 2)) for t in taus]}")
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps({"summary": summary, "tau": taus, "cpu_count": os.cpu_count(),
                                  "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2) + "\n")
    print(f"wrote {RESULT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
