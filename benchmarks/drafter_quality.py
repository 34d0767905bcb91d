"""Which objective, optimizer and label source train the best drafter: an ablation on the tiny run.

Stage 1 trains recipes/tiny.yaml with every combination of `stages.train.loss` (decay_ce, dpace) x
`optimizer` (adamw, muon) x `labels` (data, target), each with `--seeds` seeds (the seed draws the
drafter's init, the anchors and the data order). Stage 2 takes stage 1's winner (highest mean τ) and
varies its learning rate (x0.5, x2) and the anchors drawn per sequence (32, 128). Every drafter
trains the same optimizer steps on the same tokenized data (one tiny pipeline up to tokenize, made
once) and is evaluated on the same 16 held-out prompts: greedy, 96 new tokens, τ as the reference
DFlash loop counts it. Equal optimizer steps is the comparison; each row's training seconds (and
the machine's load while it ran) give the comparison at equal time.

Usage: python -m benchmarks.drafter_quality [--seeds 3] [--jobs 2] [--root DIR] [--ablation architecture|data]
(`--ablation architecture`: DFlash against DFlash2 instead, benchmarks/quality_architecture.py; `--ablation
data`: generation temperature x label source, evaluated greedily and at 0.6, benchmarks/quality_data.py.)
Each (variant, seed) is one worker process writing its own JSON under --root, so a killed
ablation resumes where it stopped. Prints a table as rows finish; writes
benchmarks/results/drafter_quality.json and drafter_quality.png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.quality_parts import REPO, around, grid_variants, prepare, run_one

RESULT = REPO / "benchmarks" / "results" / "drafter_quality.json"
PLOT = RESULT.with_suffix(".png")


def _row_file(root: Path, name: str, seed: int) -> Path:
    return root / "rows" / f"{name.replace(' ', '_').replace('+', '-')}-s{seed}.json"


def _run_all(root: Path, variants: dict[str, dict[str, Any]], seeds: int | dict[str, int],
             jobs: int) -> list[dict[str, Any]]:
    """Every (variant, seed) not yet on disk, `jobs` worker processes at a time (one thread each);
    `seeds` per variant where it is a dict. The longest runs start first."""
    count = seeds if isinstance(seeds, dict) else dict.fromkeys(variants, seeds)
    todo = sorted(((n, s) for n in variants for s in range(count[n]) if not _row_file(root, n, s).exists()),
                  key=lambda t: -float(variants[t[0]].get("epochs", 0)))
    running: list[tuple[subprocess.Popen, str, int]] = []
    env = os.environ | {"OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    while todo or running:
        while todo and len(running) < jobs:
            name, seed = todo.pop(0)
            out = _row_file(root, name, seed)
            out.parent.mkdir(parents=True, exist_ok=True)
            argv = [sys.executable, "-m", "benchmarks.drafter_quality", "--root", str(root), "--one", name,
                    "--train", json.dumps(variants[name]), "--seed", str(seed)]
            log = out.with_suffix(".log").open("w")
            proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
            running.append((proc, name, seed))
        time.sleep(2)
        for proc, name, seed in [r for r in running if r[0].poll() is not None]:
            running.remove((proc, name, seed))
            out = _row_file(root, name, seed)
            if proc.returncode or not out.exists():
                raise SystemExit(f"{name} seed {seed} failed: see {out.with_suffix('.log')}")
            row = json.loads(out.read_text())
            print(f"{name:<46} seed {seed}  τ {row['tau']:.3f}  loss {row['final_loss']:.3f}  "
                  f"{row['train_s']:.0f} s train", flush=True)
    return [json.loads(_row_file(root, n, s).read_text()) for n in variants for s in range(count[n])]


def steps_to_90(curve: list[dict[str, Any]]) -> int:
    """The first logged optimizer step whose expected acceptance length (from the logged per-slot
    accuracies) reaches 90% of the run's last: how long the run needed to learn what it learnt."""
    from dflashx.dflash.loss import expected_acceptance_length

    eal = [(c["step"], expected_acceptance_length(c["accuracy"])) for c in curve]
    return next(step for step, v in eal if v - 1 >= 0.9 * (eal[-1][1] - 1))


def training_needed(variant: dict[str, Any]) -> dict[str, Any]:
    """The winner's steps to 90% and the supervised slots per trainable parameter by then, the latter
    with the plan's own count of slots per step (`rules_training.supervised_slots`) on the tiny recipe."""
    from dflashx.config.load import load_recipe
    from dflashx.plan.context import build_context
    from dflashx.plan.rules_training import supervised_slots
    from dflashx.resolve import resolve
    from dflashx.targets.facts import facts_for

    overrides = [f"stages.train.{k}={v}" for k, v in variant["train"].items()]
    recipe = load_recipe(REPO / "recipes" / "tiny.yaml", overrides).recipe
    ctx = build_context(resolve(recipe, facts_for(recipe.target)))
    per_step = supervised_slots(ctx) / ctx.training.steps
    steps = variant["steps_to_90_mean"]
    return {"variant": variant["variant"], "steps_to_90": steps, "planned_steps": ctx.training.steps,
            "slots_per_param_to_90": steps * per_step / ctx.training.drafter.matrices,
            "trainable_params": ctx.training.drafter.matrices}


def summarize(rows: list[dict[str, Any]], order: list[str]) -> list[dict[str, Any]]:
    """Per variant: τ mean and sd over seeds, acceptance by position (mean), seconds per step."""
    table = []
    for name in order:
        mine = [r for r in rows if r["variant"] == name]
        taus = [r["tau"] for r in mine]
        positions = list(zip(*(r["acceptance_by_position"] for r in mine)))
        table.append({
            "variant": name, "train": mine[0]["train"], "seeds": len(mine), "tau_mean": statistics.mean(taus),
            "tau_sd": statistics.stdev(taus) if len(taus) > 1 else 0.0, "taus": taus,
            "acceptance_by_position": [statistics.mean(v for v in p if v is not None) for p in positions],
            "final_loss_mean": statistics.mean(r["final_loss"] for r in mine),
            "s_per_step_mean": statistics.mean(r["s_per_step"] for r in mine), "steps": mine[0]["steps"],
            "steps_to_90_mean": statistics.mean(steps_to_90(r["curve"]) for r in mine),
        })
    return table


def _print(table: list[dict[str, Any]]) -> None:
    print(f"\n{'variant':<46} {'τ mean ± sd':>14} {'acc@1':>6} {'acc@4':>6} {'acc@7':>6} {'s/step':>7}")
    for t in table:
        acc = t["acceptance_by_position"]
        print(f"{t['variant']:<46} {t['tau_mean']:>7.3f} ± {t['tau_sd']:.3f} {acc[0]:>6.3f} {acc[3]:>6.3f} "
              f"{acc[-1]:>6.3f} {t['s_per_step_mean']:>7.3f}")


def plot(table: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    names = [t["variant"] for t in table]
    left.barh(names, [t["tau_mean"] for t in table], xerr=[t["tau_sd"] for t in table], color="tab:blue")
    for i, t in enumerate(table):
        left.plot(t["taus"], [i] * len(t["taus"]), "k.", ms=4)
    left.set(xlabel="τ (reference count), mean ± sd over seeds", title="Tiny run: τ per variant")
    left.invert_yaxis()
    for t in sorted(table, key=lambda t: -t["tau_mean"])[:5]:
        acc = t["acceptance_by_position"]
        right.plot(range(1, len(acc) + 1), acc, marker="o", label=f"{t['variant']} (τ {t['tau_mean']:.2f})")
    right.set(xlabel="draft position k", ylabel="P(position k accepted)", ylim=(0, 1.02),
              title="Acceptance by position (top 5)")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2, help="worker processes at once (one thread each)")
    parser.add_argument("--root", type=Path, default=REPO / ".cache" / "drafter_quality")
    parser.add_argument("--ablation", choices=["objective", "architecture", "data"], default="objective",
                        help="objective: loss x optimizer x labels; architecture: DFlash vs DFlash2 "
                             "(benchmarks/quality_architecture.py); data: generation temperature x labels, "
                             "greedy and sampled eval (benchmarks/quality_data.py)")
    parser.add_argument("--long-seeds", type=int, default=1, help="seeds of the architecture ablation's long runs")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--train", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # a worker: one variant, one seed
        from benchmarks.quality_data import SERVED, generation, prep_root

        train = json.loads(args.train)
        if "prep" in train:  # a data-ablation cell: its own data, τ also at the serving temperature
            temperature = float(train["prep"])
            data = prepare(prep_root(args.root, temperature), [f"{k}={v}" for k, v in generation(temperature).items()])
            run_one(args.one, train, args.seed, data, _row_file(args.root, args.one, args.seed), SERVED)
        else:
            run_one(args.one, train, args.seed, prepare(args.root), _row_file(args.root, args.one, args.seed))
        return
    if args.ablation == "data":
        from benchmarks import quality_data

        table = quality_data.run(args.root, args.seeds, args.jobs, _run_all, summarize, _print)["table"]
        plot(table, quality_data.RESULT.with_suffix(".png"))
        print(f"\nwrote {quality_data.RESULT} and its plot")
        return
    data = prepare(args.root)
    if args.ablation == "architecture":
        from benchmarks import quality_architecture

        table = quality_architecture.run(args.root, args.seeds, args.long_seeds, args.jobs, _run_all, summarize,
                                         _print)["table"]
        plot(table, quality_architecture.RESULT.with_suffix(".png"))
        print(f"\nwrote {quality_architecture.RESULT} and its plot")
        return
    from dflashx.config.load import load_recipe

    tiny = load_recipe(REPO / "recipes" / "tiny.yaml").recipe.stages.train
    grid = grid_variants()
    rows = _run_all(args.root, grid, args.seeds, args.jobs)
    stage1 = summarize(rows, list(grid))
    best = max(stage1, key=lambda t: t["tau_mean"])
    second = around(best["variant"], best["train"], tiny.lr, tiny.anchors_per_seq)
    rows += _run_all(args.root, second, args.seeds, args.jobs)
    table = stage1 + summarize(rows, list(second))
    _print(table)
    best_overall = max(table, key=lambda t: t["tau_mean"])
    RESULT.write_text(json.dumps({
        "recipe": "recipes/tiny.yaml", "seeds": args.seeds, "jobs": args.jobs, "cpu_count": os.cpu_count(),
        "eval": "16 held-out prompts, greedy, 96 new tokens, τ = tokens after the prefill's first / cycles",
        "winner_stage1": best["variant"], "winner": best_overall["variant"],
        "training_needed": training_needed(best), "table": table, "rows": rows,
    }, indent=1) + "\n")
    plot(table, PLOT)
    print(f"\nwrote {RESULT} and {PLOT}")


if __name__ == "__main__":
    main()
