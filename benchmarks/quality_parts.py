"""The parts of benchmarks/drafter_quality.py: the variants, the shared tiny data, and one variant
trained and evaluated with one seed (the product's trainer and speculative decoder, in-process).

A variant is a set of recipe overrides on recipes/tiny.yaml (a plain key is a stages.train key, a dotted one a
whole recipe key); every variant trains on the same
tokenized data and is evaluated on the same held-out prompts (the tiny recipe's 16, greedy, 96 new
tokens, τ counted as the reference DFlash loop counts it: `dflashx.dflash.acceptance.summarize`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "tiny.yaml"

# Stage 1: loss x optimizer x label source, everything else the tiny recipe's.
GRID = {
    "loss": ("decay_ce", "dpace"),
    "optimizer": ("adamw", "muon"),
    "labels": ("data", "target"),
}
# Stage 2, around stage 1's winner: the learning rate (both groups under Muon: muon_lr follows lr
# unless set) and the anchors drawn per sequence.
LR_FACTORS = (0.5, 2.0)
ANCHORS = (32, 128)


def grid_variants() -> dict[str, dict[str, Any]]:
    """Stage 1's variants: name -> overrides."""
    out = {}
    for loss in GRID["loss"]:
        for opt in GRID["optimizer"]:
            for labels in GRID["labels"]:
                out[f"{loss}+{opt}+{labels}"] = {"loss": loss, "optimizer": opt, "labels": labels}
    return out


def around(name: str, base: dict[str, Any], lr: float, anchors: int) -> dict[str, dict[str, Any]]:
    """Stage 2's variants around the winner `name` (its lr `lr` and anchors `anchors`)."""
    out = {f"{name} lr x{f:g}": base | {"lr": lr * f} for f in LR_FACTORS}
    out |= {f"{name} anchors {a}": base | {"anchors_per_seq": a} for a in ANCHORS if a != anchors}
    return out


# The architecture ablation (`--ablation architecture`): DFlash against DFlash2 at blocks 8 and 16, DFlash2
# with both policies for a label outside the selector's top-k. Keys with a dot are whole recipe keys.
BLOCKS = (8, 16)
GOLD_MISSING = ("skip", "swap")
LONG_FACTOR = 3  # the long runs train this many times the tiny recipe's epochs
SAMPLE_SEEDS = 3  # sampling seeds per drafter for τ at a temperature (the data ablation)


def architecture_variants() -> dict[str, dict[str, Any]]:
    """Stage A of the architecture ablation (equal optimizer steps): name -> overrides."""
    out: dict[str, dict[str, Any]] = {}
    for block in BLOCKS:
        out[f"dflash b{block}"] = {"drafter.block_size": block}
        for policy in GOLD_MISSING:
            out[f"dflash2 b{block} {policy}"] = {"drafter.block_size": block, "drafter.architecture": "dflash2",
                                                  "selector_gold_missing": policy}
    return out


def overrides(train: dict[str, Any], seed: int) -> list[str]:
    """Recipe overrides: a key with a dot as it is, any other a stages.train key (`prep`, the data a
    variant trains on, is none); the seed last."""
    return ([f"{k if '.' in k else 'stages.train.' + k}={v}" for k, v in train.items() if k != "prep"]
            + [f"stages.train.seed={seed}"])


def prepare(root: Path, generation: list[str] | None = None) -> dict[str, Path]:
    """The tiny pipeline up to tokenize, once (its stage keys do not depend on the train section);
    `generation`: recipe overrides of the data (the data ablation's generation temperature)."""
    run = root / "prep"
    dataset, prompts = run / "tiny" / "tokenize" / "dataset", run / "tiny" / "ingest" / "eval_prompts.jsonl"
    if not dataset.exists():
        argv = [sys.executable, "-m", "dflashx.cli.main", "run", str(RECIPE), f"storage.root={run}",
                "stages.train.enabled=false", "stages.eval.enabled=false", "stages.export.enabled=false",
                *(generation or [])]
        subprocess.run(argv, cwd=REPO, check=True, env=os.environ | {"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    return {"dataset": dataset, "prompts": prompts}


def _resolved(train: dict[str, Any], seed: int):
    from dflashx.config.load import load_recipe
    from dflashx.resolve import resolve
    from dflashx.targets.facts import facts_for

    recipe = load_recipe(RECIPE, overrides(train, seed)).recipe
    return resolve(recipe, facts_for(recipe.target))


def _evaluate(recipe: Any, checkpoint: Path, prompts_file: Path, sampled_at: float = 0.0) -> dict[str, Any]:
    """The eval stage's measurement on the trained drafter alone: greedy speculative decoding, and with
    `sampled_at` > 0 also τ at that temperature (rejection sampling), the mean over SAMPLE_SEEDS seeds."""
    import torch

    from dflashx.data.chat_mask import render_prompt
    from dflashx.data.suites import load_prompts
    from dflashx.dflash.acceptance import summarize
    from dflashx.dflash.checkpoint import load_drafter
    from dflashx.dflash.spec_decode import SpecDecoder
    from dflashx.targets.load import load_model, load_tokenizer, stop_ids

    ev = recipe.stages.eval
    target = load_model(recipe.target, recipe.target.load_precision)  # as the eval stage loads it
    tokenizer = load_tokenizer(recipe.target)
    drafter = load_drafter(checkpoint, device="cpu")
    stops = stop_ids(recipe.target, tokenizer)
    decoder = SpecDecoder(target, drafter)
    prompts = [tokenizer(render_prompt(tokenizer, p, recipe.target.chat_template), add_special_tokens=False)
               ["input_ids"] for p in load_prompts(prompts_file, ev.num_prompts)]
    out = summarize([decoder.generate(ids, ev.max_new_tokens, 0.0, stops) for ids in prompts],
                    drafter.config.block_size)
    if sampled_at:
        taus = []
        for seed in range(SAMPLE_SEEDS):
            gen = torch.Generator().manual_seed(seed)
            runs = [decoder.generate(ids, ev.max_new_tokens, sampled_at, stops, gen) for ids in prompts]
            taus.append(summarize(runs, drafter.config.block_size)["tau"])
        out["tau_sampled"], out["tau_sampled_seeds"] = sum(taus) / len(taus), taus
    return out


def run_one(name: str, train: dict[str, Any], seed: int, data: dict[str, Path], out: Path,
            sampled_at: float = 0.0) -> dict[str, Any]:
    """Train variant `name` with `seed` through the product's trainer (DeepSpeed, in-process), evaluate it
    (greedy; also at temperature `sampled_at` when > 0), write `out` (JSON) atomically and return it."""
    from dflashx.dflash.job import TrainJob
    from dflashx.dflash.trainer import run_training
    from dflashx.targets.locate import locate_target, locate_tokenizer

    recipe = _resolved(train, seed)
    stage = out.with_suffix("")
    job = TrainJob.of(recipe, stage, data["dataset"], locate_target(recipe.target),
                       locate_tokenizer(recipe.target))
    curve: list[dict[str, Any]] = []
    start = time.perf_counter()
    last = run_training(job, log=lambda metrics, step: curve.append(metrics))
    train_s = time.perf_counter() - start
    summary = _evaluate(recipe, stage / "checkpoint", data["prompts"], sampled_at)
    row = {
        "variant": name, "train": train, "seed": seed, "steps": last.get("step"), "train_s": train_s,
        "s_per_step": train_s / max(1, last.get("step") or 1), "final_loss": last.get("loss"),
        "tau": summary["tau"], "tau_sampled": summary.get("tau_sampled"),
        "tau_sampled_seeds": summary.get("tau_sampled_seeds"), "accepted_plus_one": summary["accepted_plus_one"],
        "acceptance_by_position": summary["acceptance_by_position"], "cycles": summary["cycles"],
        "curve": [{"step": m["step"], "loss": m["loss"], "accuracy": m["accuracy"]} for m in curve],
        "load_avg_1m": os.getloadavg()[0],
    }
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(row, indent=1))
    tmp.replace(out)
    return row
