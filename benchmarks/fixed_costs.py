"""The fixed costs of the pipeline's stages, each measured in isolation (not from a pipeline run).

    python -m benchmarks.fixed_costs [--repeats 5]

Each repeat starts a fresh Python process that does, timed one by one and mostly in the pipeline's
order, what a stage does besides its per-token work on the tiny recipe (recipes/tiny.yaml): open and
finish an offline W&B run (twice: the first also imports W&B and starts its service), import pandas
and pyarrow (which the pipeline imports at W&B's start), import torch and transformers, load the tiny
target's tokenizer and weights (twice: the first load also imports the architecture's modeling code),
import matplotlib (QC and eval plots), draw one QC histogram figure (twice: the first also sets
matplotlib up), write the eval stage's report (the predicted speed-up and its two figures, from 2 drafters' decodes
of 2 suites of 16 prompts), import datasets, set up the one-rank process group (imports DeepSpeed), build the
DeepSpeed engine around a fresh drafter (twice: the first also pays DeepSpeed's once-per-process set-up, as
the run's train stage after its pilot's does not), save one training checkpoint, write and read the drafter's
safetensors, do the export stage's work on that drafter (load it, write both layouts, read them back against the
engines' contracts, write the READMEs) and the orchestrator's around one stage (its log captured, its watchdog, the
export's two folders hashed and registered in a manifest), then run the tokenize stage's function on 400 one-line
completions twice and on 4,000 once (the first call pays its once-per-process set-up: the stage's module, the
datasets steps' first use, the chat template's compile; the 400 and 4,000 calls after it give its cost per sample
and per call apart).
The parent
also times a bare interpreter (`python -c pass`). Each part is timed as wall time and as the
process's CPU time with its waited-for children (`<part>_cpu`: on a shared machine, about what
an idle core's wall time is). Medians over the repeats go to
benchmarks/results/fixed_costs.json with the machine they ran on; `dflashx/plan/estimates/fixed.py`
cites them. Nothing here reads a pipeline run, so the planner's fixed-cost terms are not fitted to
the tiny run they are checked against (benchmarks/tiny_run.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from dflashx.store.atomic import atomic_write_text

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "benchmarks" / "results" / "fixed_costs.json"
RECIPE = REPO / "recipes" / "tiny.yaml"


def _timed(parts: dict[str, float], name: str, fn: Callable[[], Any]) -> Any:
    """Run `fn`; record its wall time as `name` and the CPU time of this process and of the child
    processes it waited for (DeepSpeed's compiler probes) as `name`_cpu. A full garbage collection runs first,
    untimed: once torch is imported, the collector's full pass over the heap (~0.25 s here) lands in whichever part
    happens to cross its threshold (it fell in the first QC figure on one day and in the second on the next)."""
    gc.collect()
    start, cpu = time.perf_counter(), _cpu_seconds()
    out = fn()
    parts[name] = time.perf_counter() - start
    parts[f"{name}_cpu"] = _cpu_seconds() - cpu
    return out


def _cpu_seconds() -> float:
    """This process's CPU time at the clock's full resolution (`os.times` counts in 10 ms ticks, as coarse as the
    export's or a stage's bookkeeping), with its waited-for children's (in ticks)."""
    t = os.times()
    return time.process_time() + t.children_user + t.children_system


def child(out: Path) -> None:
    """One fresh process: time each part in pipeline order; write {part: seconds} to `out`."""
    from dflashx.config.load import load_recipe
    from dflashx.resolve import resolve
    from dflashx.targets.facts import facts_for
    from dflashx.targets.locate import locate_target

    recipe = load_recipe(RECIPE).recipe
    resolved = resolve(recipe, facts_for(recipe.target))
    target_path = str(locate_target(recipe.target))  # built into the cache before anything is timed
    parts: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        _timed(parts, "wandb_run_first", lambda: _wandb_run(Path(tmp), "a"))  # ingest: the first stage
        _timed(parts, "wandb_run", lambda: _wandb_run(Path(tmp), "b"))
        # the tiny run imports pandas and pyarrow at W&B's start in its first stage (`python -X importtime` of
        # it: ingest/stage.log, after W&B's exporters), so datasets is timed after them
        _timed(parts, "import_pandas", lambda: (__import__("pandas"), __import__("pyarrow")))
        _timed(parts, "import_torch_transformers", lambda: __import__("transformers").AutoModelForCausalLM)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = _timed(parts, "tokenizer_load", lambda: AutoTokenizer.from_pretrained(target_path))
        _timed(parts, "model_load_first", lambda: AutoModelForCausalLM.from_pretrained(target_path))
        target = _timed(parts, "model_load", lambda: AutoModelForCausalLM.from_pretrained(target_path).eval())
        _timed(parts, "import_matplotlib", _import_matplotlib)
        _timed(parts, "figure_first", lambda: _figure(Path(tmp) / "a.png"))
        _timed(parts, "figure", lambda: _figure(Path(tmp) / "b.png"))
        report = _eval_report(resolved)
        _timed(parts, "eval_report", lambda: report(Path(tmp)))
        _timed(parts, "import_datasets", lambda: __import__("datasets"))
        _train_parts(parts, resolved, target, tokenizer, target_path, Path(tmp))
        _tokenize_parts(parts, Path(tmp), target_path)
    out.write_text(json.dumps(parts))


def _import_matplotlib() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot


def _figure(path: Path) -> None:
    """One QC histogram figure as the QC report draws and writes it (284 samples, as the tiny run's)."""
    import random

    from dflashx.data.qc_report import _histogram

    _histogram([random.Random(0).randint(1, 120) for _ in range(284)], path, "words", "words", 4)


def _eval_report(resolved: Any) -> Callable[[Path], None]:
    """What the eval stage does after its decodes, as on the tiny run: the trained drafter's predicted speed-up at
    the deploy concurrencies (`eval_speedup.section`, speedup.png) and acceptance.png (5 panels: per position,
    accepted length, per source, per context bucket, per suite), from synthetic decodes of 16 prompts in each of
    2 suites by the trained and the untrained drafter (block 8). The modules are imported and the decodes summarised
    here, untimed; the returned call writes the report into a folder."""
    import random

    from dflashx.dflash.acceptance import drafter_summary, plot_acceptance
    from dflashx.dflash.spec_decode import DecodeResult
    from dflashx.stages import eval_speedup

    rng, block = random.Random(0), resolved.drafter.block_size

    def decodes(best: int) -> list[DecodeResult]:
        out = []
        for _ in range(16):
            accepted = [rng.randint(0, best) for _ in range(12)]
            out.append(DecodeResult(list(range(1 + sum(a + 1 for a in accepted))), [block - 1] * 12, accepted, 0.1))
        return out

    sources, buckets = ["alpaca"] * 8 + ["sharegpt"] * 8, ["<1K"] * 16
    suites = {suite: {name: drafter_summary(decodes(best), block, sources, buckets)
                      for name, best in (("trained", block - 1), ("untrained", 0))} for suite in ("heldout", "mt")}
    result = {"sampling": None, "trained": suites["heldout"]["trained"], "prompts": 16, "block_size": block}

    def write(folder: Path) -> None:
        eval_speedup.section(resolved, result, folder)
        plot_acceptance(suites["heldout"], folder / "acceptance.png", suites=suites, suite="heldout")
    return write


TOKENIZE_SAMPLES = 400
TOKENIZE_SAMPLES_LARGE = 10 * TOKENIZE_SAMPLES


def _tokenize_parts(parts: dict[str, float], tmp: Path, tokenizer: str) -> None:
    """The tokenize stage's function: its first call in the process, the same call again, and on ten times the
    samples (each call in its own folder, as each stage run has its own). The stages' base module, which the `dflashx
    run` process holds before its first stage, is imported first."""
    __import__("dflashx.stages.base")
    for name, samples in (("tokenize_first", TOKENIZE_SAMPLES), ("tokenize_again", TOKENIZE_SAMPLES),
                          ("tokenize_large", TOKENIZE_SAMPLES_LARGE)):
        folder = tmp / name
        folder.mkdir()
        _timed(parts, name, partial(_tokenize_samples, folder, tokenizer, samples))


def _tokenize_samples(folder: Path, tokenizer: str, samples: int) -> None:
    """The tokenize stage's function on `samples` synthetic one-line completions (about 27 tokens each with the chat
    template): read, render, mask, encode, filter and write (its datasets steps included)."""
    from dflashx.stages.tokenize import TokenizePolicy, tokenize_completions

    shards = folder / "completions"
    shards.mkdir()
    record = {"source": "synthetic", "messages": [{"role": "user", "content": "Say hi."}], "reasoning": "hi",
              "answer": "Hi.", "finish_reason": "stop", "usage": {"prompt_tokens": 8, "completion_tokens": 6}}
    (shards / "shard-00000.jsonl").write_text("".join(json.dumps({"id": f"s{i}", **record}) + "\n"
                                                      for i in range(samples)))
    tokenize_completions(shards, folder / "tokenized", tokenizer, TokenizePolicy(max_length=256, overflow="drop",
                                                                                 min_loss_tokens=1),
                         enable_thinking=True, template_kwargs={}, num_proc=1, shard_size=100_000)


def _wandb_run(folder: Path, name: str) -> None:
    import wandb

    run = wandb.init(project="fixed-costs", name=name, dir=str(folder), mode="offline", reinit="create_new",
                     settings=wandb.Settings(silent=True, console="off", save_code=False, disable_git=True))
    run.finish()


def _train_parts(parts: dict[str, float], resolved: Any, target: Any, tokenizer: Any, target_path: str,
                 tmp: Path) -> None:
    """The train stage's set-up and write-out around its steps, the export stage's work on its drafter, and the
    orchestrator's around a stage."""
    import torch

    from dflashx.dflash import checkpoint as ckpt
    from dflashx.dflash.distributed import setup_distributed, teardown_distributed
    from dflashx.dflash.job import TrainJob
    from dflashx.dflash.step import TrainStep
    from dflashx.dflash.trainer import build_drafter
    from dflashx.stages.export import write_export

    _timed(parts, "process_group", setup_distributed)
    job = TrainJob.of(resolved, tmp / "train", tmp / "dataset", target_path, target_path)
    drafter = build_drafter(job, target.config, tokenizer)
    step = _timed(parts, "engine_build", lambda: TrainStep(job, target, drafter, 10, torch.device("cpu")))
    again = build_drafter(job, target.config, tokenizer)  # a second train stage in the same process (after a pilot)
    _timed(parts, "engine_build_again", lambda: TrainStep(job, target, again, 10, torch.device("cpu")))
    _timed(parts, "checkpoint_save", lambda: ckpt.save_training_state(step.engine, tmp / "ckpt", 1, {"micro": 1},
                                                                     {}, loss=1.0, keep=2))
    _timed(parts, "drafter_save", lambda: ckpt.save_drafter(drafter, tmp / "drafter"))
    _timed(parts, "drafter_load", lambda: ckpt.load_drafter(tmp / "drafter"))
    teardown_distributed()
    exported = tmp / "export"
    _timed(parts, "export", lambda: write_export(resolved, ckpt.load_drafter(tmp / "drafter"), exported, target_path,
                                                 None))
    _timed(parts, "bookkeeping", _bookkeeping(exported))


def _bookkeeping(folder: Path) -> Callable[[], None]:
    """What the orchestrator does around one stage inside its timer (`dflashx.run.executor.execute`: the stage's
    output captured into stage.log, the watchdog started and stopped, `orchestrator.register_outputs`: the artifacts
    hashed and registered in the manifest, which is saved), here around a stage that returns the export's two
    folders at once."""
    from types import SimpleNamespace

    from dflashx.run.executor import execute
    from dflashx.run.keys import StageKey
    from dflashx.run.observer import SilentObserver
    from dflashx.run.orchestrator import register_outputs
    from dflashx.stages.base import Artifact, StageResult
    from dflashx.stages.export import OUT, VLLM, VLLM_DIR

    result = StageResult(artifacts={OUT: Artifact(OUT), VLLM: Artifact(VLLM_DIR)})
    key = StageKey("bench", {"train.checkpoint": None})

    def stage() -> None:
        ran = execute(lambda _ctx: result, SimpleNamespace(out_dir=folder), label="export",  # type: ignore[arg-type]
                      key=key.key, reason=None, estimate_s=1.0, log=folder / "stage.log", observer=SilentObserver(),
                      finish=lambda done: register_outputs(folder, "export", key, done, folder, {}, 0.0))
        if ran.error is not None:
            raise ran.error
    return stage


def interpreter_seconds() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    runs: list[dict[str, float]] = []
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONPATH": str(REPO)}
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "parts.json"
            subprocess.run([sys.executable, "-m", "benchmarks.fixed_costs", "--child", str(out)], cwd=REPO, env=env,
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            runs.append(json.loads(out.read_text()) | {"interpreter": interpreter_seconds()})
    median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"{'part':28} {'median s':>9}   runs")
    for k, v in median.items():
        print(f"{k:28} {v:9.3f}   {', '.join(f'{r[k]:.3f}' for r in runs)}")
    result = {"median_s": median, "runs_s": runs, "repeats": args.repeats, "cpu_count": os.cpu_count(),
              "load_avg_1m": os.getloadavg()[0], "machine": platform.machine(), "python": platform.python_version(),
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
              "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_text(RESULT, json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
