"""The train stage: online DFlash drafter training on DeepSpeed.

Reads `tokenize.dataset` and, for held-out τ while training (`stages.train.tau_every`), the ingest
stage's held-out prompts (`ingest.eval_prompts`: `heldout_slice`); writes `checkpoint` (the drafter in
the exported DFlash layout: config.json + model.safetensors, loadable by
`dflashx.dflash.checkpoint.load_drafter`; with τ measured, `tau.json` and `best/`:
`dflashx.dflash.tau_record.HeldOutTau`) and `logs` (metrics.jsonl). With one process (the CPU profile,
one GPU) it trains in-process and logs every log step through `ctx.log`; with N GPUs it writes
`train_job.json` and runs the plan's launch (`ctx.runtime.train_launch`, a `TrainLaunch`: the resolved argv
with `{run_dir}` filled in), one process per GPU, then replays the metrics into `ctx.log`. On several nodes
it first writes the hostfile the argv reads (`write_hostfile`: node i at
`dflashx.backends.nodes.node_address(i)`, atomically). Resuming is
automatic: a stage folder with `checkpoints/latest` continues from it with the same optimizer, scheduler,
data position and RNG.

`python -m dflashx.stages.train --run-dir DIR [--stage-dir DIR/train]` is one training process
(the worker the launch command starts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflashx.backends.nodes import NodeAddressError, node_address
from dflashx.dflash.tau_record import HeldOutTau, is_tau_row, metrics_file
from dflashx.plan.launch import TrainLaunch
from dflashx.resolve.deepspeed import RUN_DIR
from dflashx.stages.base import Artifact, StageFailed, StageResult, TrainContext
from dflashx.stages.graph import GRAPH, input_name
from dflashx.store.atomic import atomic_write_text
from dflashx.store.diskspace import DiskFull
from dflashx.data import chat_contract
from dflashx.data.suites import load_prompts
from dflashx.targets.load import load_tokenizer, stop_ids
from dflashx.targets.locate import locate_target, locate_tokenizer

if TYPE_CHECKING:
    from dflashx.dflash.job import HeldOutSlice, TrainJob

INPUT = input_name("train")
HELDOUT = GRAPH["train"].optional_inputs[0]  # the ingest stage's held-out prompts: the τ slice


def _absolute(path: str) -> str:
    """Local folders become absolute (launched ranks may start elsewhere); hub ids stay."""
    return str(Path(path).resolve()) if Path(path).exists() else path


def build_job(ctx: TrainContext) -> "TrainJob":
    """The `TrainJob` of this stage: the resolved recipe's sections and where the inputs are."""
    from dflashx.dflash.job import TrainJob

    if INPUT not in ctx.inputs:
        raise ValueError(f"train stage needs input `{INPUT}` (the tokenize stage's dataset); enable stages.tokenize")
    recipe = ctx.recipe
    init_from = recipe.drafter.init_from
    if init_from:
        drafter = recipe.drafter.model_copy(update={"init_from": _absolute(init_from)})
        recipe = recipe.model_copy(update={"drafter": drafter})
    target = _absolute(str(locate_target(recipe.target)))
    return TrainJob.of(recipe, ctx.out_dir.resolve(), Path(ctx.inputs[INPUT]).resolve(), target,
                       _absolute(str(locate_tokenizer(recipe.target))), heldout_slice(ctx), _tau_every(ctx))


def _train_launch(ctx: TrainContext) -> TrainLaunch:
    launch = ctx.runtime.train_launch
    assert launch is not None, "every resolved plan has the train stage's launch (plan.expand.deepspeed)"
    return launch


def _filled(text: str, ctx: TrainContext) -> str:
    """A launch string with `{run_dir}` filled in."""
    return text.replace(RUN_DIR, str(ctx.run_dir))


def _tau_every(ctx: TrainContext) -> int:
    """The held-out τ interval the plan decided (`StagePlan.tau_every`; the recipe's own value when given)."""
    planned = ctx.runtime.tau_every
    assert planned is not None, "every resolved plan plans the train stage's held-out τ interval"
    return planned


def heldout_slice(ctx: TrainContext) -> "HeldOutSlice | None":
    """The held-out prompts a τ measurement decodes: the first `tau_prompts` of the ingest stage's held-out
    split, read, rendered and stopped as the eval stage's `heldout` suite reads, renders and stops them
    (`dflashx.data.suites.load_prompts`, `render_prompt`, `targets.load.stop_ids`); None when not measured."""
    train = ctx.recipe.stages.train
    if not _tau_every(ctx) or HELDOUT not in ctx.inputs:
        return None
    from dflashx.data.chat_mask import render_prompt
    from dflashx.dflash.job import HeldOutSlice

    tokenizer = load_tokenizer(ctx.recipe.target)
    chat = ctx.recipe.target.chat_template
    prompts = [tokenizer(render_prompt(tokenizer, p, chat), add_special_tokens=False)["input_ids"]
               for p in load_prompts(Path(ctx.inputs[HELDOUT]), train.tau_prompts)]
    return HeldOutSlice(prompts=prompts, stop_ids=stop_ids(ctx.recipe.target, tokenizer))


def launch_command(ctx: TrainContext) -> tuple[list[str], int]:
    """The plan's launch argv with `{run_dir}` and the stage folder filled in, and its world size."""
    launch = _train_launch(ctx)
    return [*(_filled(a, ctx) for a in launch.argv), "--stage-dir", str(ctx.out_dir)], launch.world_size


def write_hostfile(ctx: TrainContext) -> Path | None:
    """On several nodes, the hostfile the launch argv reads (`TrainLaunch.hostfile_path`), node i named by its
    real address (`node_address`: `DFLASHX_NODE_HOSTS`, else `node-<i>`), written atomically; None when the
    launch reads no hostfile. `StageFailed` when a node's address does not resolve."""
    launch = _train_launch(ctx)
    if launch.hostfile_path is None:
        return None
    path = Path(_filled(launch.hostfile_path, ctx))
    try:
        lines = launch.hostfile(node_address)
    except NodeAddressError as e:
        raise StageFailed(f"cannot write the training hostfile {path}: {e}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def _launch(ctx: TrainContext, argv: list[str]) -> None:
    from dflashx.dflash.distributed import SAFE_NCCL_ENV

    env = os.environ | SAFE_NCCL_ENV
    log_file = ctx.out_dir / "logs" / "launcher.log"
    with log_file.open("a") as out:
        proc = subprocess.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise RuntimeError(
            f"training launch failed (exit {proc.returncode}): {' '.join(argv)}; see {log_file}. "
            "Running the stage again resumes from the last checkpoint."
        )


def _replay(ctx: TrainContext) -> dict[str, Any]:
    """Every line of the launched job's metrics.jsonl into `ctx.log`; the last window (not a τ line)."""
    last: dict[str, Any] = {}
    metrics = metrics_file(ctx.out_dir)
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        row = json.loads(line)
        ctx.log(row, row.get("step"))
        last = last if is_tau_row(row) else row
    return last


def run(ctx: TrainContext) -> StageResult:
    from dflashx.dflash.trainer import run_training

    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    (ctx.out_dir / "logs").mkdir(exist_ok=True)
    job = build_job(ctx)
    contract = chat_contract.recipe_contract(ctx.recipe.target)
    try:  # a dataset rendered with another template or thinking mode is refused before any step
        chat_contract.check(contract, Path(job.dataset), INPUT)
    except chat_contract.ContractMismatch as e:
        raise StageFailed(str(e)) from None
    job.save()
    argv, world = launch_command(ctx)
    started = time.monotonic()
    if world > 1:
        write_hostfile(ctx)
        _launch(ctx, argv)
        last = _replay(ctx)
    else:
        try:
            last = run_training(job, log=ctx.log)
        except DiskFull as e:  # the last complete checkpoint is intact: a rerun resumes from it
            raise StageFailed(str(e)) from None
    chat_contract.write(ctx.out_dir / "checkpoint", contract)  # what the drafter was trained for
    kept = ("loss", "acceptance_length", "accuracy", "tokens_per_s", "tflops", "mfu", "step", "kernels")
    metrics: dict[str, Any] = {k: last[k] for k in kept if k in last} | probe_share(ctx, time.monotonic() - started)
    tau = HeldOutTau.read(ctx.out_dir / "checkpoint")
    if tau is not None:
        metrics |= tau.summary()
    return StageResult(
        artifacts={
            "checkpoint": Artifact("checkpoint", tier="irreplaceable",
                                   description="DFlash drafter (config.json + model.safetensors)"),
            "logs": Artifact("logs", tier="replaceable", description="training metrics (metrics.jsonl)"),
        },
        metrics=metrics | {"world_size": world},
    )


def probe_share(ctx: TrainContext, seconds: float) -> dict[str, Any]:
    """What the held-out τ measurements took (`heldout_seconds` of logs/metrics.jsonl; after a resume, the killed
    attempt's kept lines too), and their share of this attempt's training wall time `seconds` (the plan sizes
    `tau_every` for at most `resolve.tau.TAU_SHARE`)."""
    log = metrics_file(ctx.out_dir)
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    probe = sum(float(r.get("heldout_seconds") or 0.0) for r in rows if is_tau_row(r))
    return {"tau_probe_seconds": probe, "tau_probe_share": probe / seconds} if probe and seconds > 0 else {}


def main(argv: list[str] | None = None) -> None:
    """One training process: `--run-dir DIR` (stage folder DIR/train unless --stage-dir)."""
    import argparse

    from dflashx.dflash import trainer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--stage-dir")
    parser.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)  # deepspeed launcher adds it
    args = parser.parse_args(argv)
    trainer.main(["--stage-dir", args.stage_dir or str(Path(args.run_dir) / "train"), "--run-dir", args.run_dir])


if __name__ == "__main__":  # a launched rank: a long process of its own
    from dflashx.track.collector import for_long_process

    for_long_process()
    main(sys.argv[1:])
