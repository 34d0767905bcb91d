"""Online (or offline) DFlash training on a DeepSpeed engine, in-process or one process per GPU.

Every rank holds its own frozen target copy (or, with `target_sharding: zero3`, its ZeRO-3 partition of
it: `dflashx.dflash.target_shard`) and its own shard of the data (DistributedSampler);
the drafter is the only module DeepSpeed manages (ZeRO 0/1/2, bf16 or fp32, gradient
accumulation; `stages.train.optimizer`: Muon, DeepSpeed's, for the 2-D matrices and AdamW for the rest
(the default), or AdamW for all, `dflashx.dflash.job.parameter_groups`; warm-up then
`stages.train.schedule`, cosine or linear; gradient clipping under AdamW only), built with the resolved
recipe's DeepSpeed config (`dflashx.resolve.deepspeed`) exactly as the plan prints it; the job
(`TrainJob`, `dflashx.dflash.job`) is the resolved target, drafter and train sections plus where the
inputs are, and the trainer re-derives none of their values. The step itself (engine, FP8 drafter,
compiled layers, fused loss) is `dflashx.dflash.step`, the one the benchmark times; this module loads,
loops, logs (`dflashx.dflash.window`), checkpoints.

Entry points:
  `run_training(job, log=None) -> dict` — one process of the job (rank from the environment,
  or a one-rank group: `dflashx.dflash.distributed`);
  `main(["--stage-dir", DIR, "--run-dir", RUN])` — the same from `DIR/train_job.json`; a launched
  rank enters through `python -m dflashx.stages.train --run-dir RUN [--stage-dir DIR]` (the resolved
  launch argv, `stages.train.launch`), which calls it.
The target and its tokenizer (`target.tokenizer` when set) load through `dflashx.targets.load`.
Outputs in the stage folder: `checkpoints/` (atomic DeepSpeed states + `latest`), `checkpoint/`
(the drafter in the exported DFlash layout; with held-out τ measured, `tau.json` and the best-τ drafter
in `best/` when it is not the last: `dflashx.dflash.tau_probe`), `best-tau/` (the best-τ drafter so far),
`logs/metrics.jsonl` (one line per log step and per τ measurement),
`logs/kernels.json` (which implementation of each speed switch ran).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from dflashx.dflash import checkpoint as ckpt
from dflashx.dflash.capture import FeatureCapture
from dflashx.dflash.config import DFlashConfig, text_config
from dflashx.dflash.data import load_token_dataset, make_loader
from dflashx.dflash.distributed import setup_distributed, teardown_distributed
from dflashx.dflash.job import JOB_FILE, TrainJob, check_world, torch_dtype
from dflashx.dflash.model import DFlashDrafter
from dflashx.dflash.step import TrainStep
from dflashx.dflash.target_shard import shard_target
from dflashx.dflash.tau_probe import TauProbe
from dflashx.dflash.tau_record import metrics_file
from dflashx.dflash.window import Window
from dflashx.resolve.compile_rule import DECIDE_AFTER_STEPS, WARMUP_STEPS
from dflashx.resolve.formulas import optimizer_steps, steps_per_epoch
from dflashx.store.atomic import atomic_write_text
from dflashx.targets.load import model_from, tokenizer_from

__all__ = ["TrainJob", "build_drafter", "main", "run_training"]
Log = Callable[[dict[str, Any], int], None]


def _load_target(job: TrainJob, device: torch.device) -> tuple[nn.Module, Any, DFlashDrafter]:
    """The frozen target on `device`, its tokenizer, and the drafter built for it.

    `target.precision: fp8`: the linear layers the capture runs (decoder layers up to the deepest
    tapped one) are converted to FP8 while the weights are still in host memory, so the GPU never
    holds the bf16 copies; layers past the deepest tapped one never run. `stages.train.target_sharding:
    zero3`: the target is partitioned over the ranks (`dflashx.dflash.target_shard`).
    """
    target = model_from(job.target_path, job.target.load_precision)
    tokenizer = tokenizer_from(job.tokenizer_path)
    with device:  # initialised where it trains: a 2.6B drafter takes ~30 s to initialise on CPU cores
        drafter = build_drafter(job, target.config, tokenizer)
    if job.target.load_precision == "fp8":
        from dflashx.dflash.fp8 import target_to_fp8

        swapped = target_to_fp8(target, device, depth=max(drafter.config.target_layer_ids) + 1)
        logging.getLogger(__name__).info("target in FP8: %d linear layers", swapped)
    if job.train.target_sharding == "zero3":
        return _sharded(job, target), tokenizer, drafter
    return target.to(device).eval().requires_grad_(False), tokenizer, drafter


def _sharded(job: TrainJob, target: nn.Module) -> nn.Module:
    """The target partitioned over the ranks (`stages.train.target_sharding: zero3`)."""
    if job.target.load_precision == "fp8":
        raise ValueError("stages.train.shard_target partitions parameters, and an FP8 target keeps its weights in "
                         "buffers: set target.precision to bf16 or stages.train.shard_target to never")
    config = job.train.target_deepspeed_config
    if config is None:  # resolve writes it whenever target_sharding is zero3
        raise ValueError("stages.train.target_sharding is zero3 but the resolved recipe has no "
                         "target_deepspeed_config: resolve the recipe again (dflashx plan)")
    return shard_target(target, config)


def build_drafter(job: TrainJob, target_config: Any, tokenizer: Any = None) -> DFlashDrafter:
    """A fresh drafter from the resolved drafter, or the checkpoint `drafter.init_from` names,
    checked against the target. The mask token's text is recorded when the tokenizer has one."""
    if job.drafter.init_from:
        drafter = ckpt.load_drafter(job.drafter.init_from)
        t, have = text_config(target_config), drafter.config
        want = (int(t["hidden_size"]), int(t["vocab_size"]), int(t["num_hidden_layers"]))
        if (have.hidden_size, have.vocab_size, have.num_target_layers) != want:
            raise ValueError(
                f"{job.drafter.init_from}: drafter.init_from was trained for another target (hidden, vocab, layers "
                f"{have.hidden_size, have.vocab_size, have.num_target_layers} vs the target's {want}); "
                "remove drafter.init_from or change target"
            )
        return drafter
    mask = job.drafter.mask_token_id
    text = tokenizer.convert_ids_to_tokens(mask) if tokenizer is not None and mask < len(tokenizer) else None
    fresh = DFlashConfig.from_target(job.drafter, target_config, text)
    torch.manual_seed(job.train.seed)
    return DFlashDrafter(fresh)


def _rank_state(g: int) -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(), "micro": g}


def _restore_rank_state(state: dict[str, Any]) -> None:
    if state:
        torch.set_rng_state(state["torch"])
        np.random.set_state(state["numpy"])
        random.setstate(state["python"])


def _trim_metrics(path: Path, step: int) -> None:
    """Drop lines logged after the checkpoint a resumed run starts from (they will be redone)."""
    if path.exists():
        keep = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= step]
        atomic_write_text(path, "".join(f"{line}\n" for line in keep))


def _offline_features(job: TrainJob, capture: FeatureCapture, ds: Any, rank: int, world: int, pad_id: int,
                      device: torch.device) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    """Offline: each rank writes its rows' features to shards once, then training reads them."""
    from dflashx.dflash.offline import OfflineFeatures, write_features

    folder = Path(job.stage_dir) / "features"
    write_features(capture, ds, folder, rank, world, pad_id, job.train.max_length, device)
    store = OfflineFeatures(folder)
    return lambda batch: store.batch(batch["index"].tolist(), batch["input_ids"].shape[1]).to(device)


class EagerClock:
    """Times this process's first eager optimizer steps for `compile: when_it_pays`: `tick(step)` after each
    step returns, once, the mean seconds of the steps after `WARMUP_STEPS` up to `DECIDE_AFTER_STEPS` (counted
    from where this process started, so a resumed run decides again on its own steps)."""

    def __init__(self, first_step: int):
        self.first, self.start, self.done = first_step, 0.0, False

    def tick(self, step: int) -> float | None:
        n = step - self.first
        if self.done or n not in (WARMUP_STEPS, DECIDE_AFTER_STEPS):
            return None
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        now = time.perf_counter()
        if n == WARMUP_STEPS:
            self.start = now
            return None
        self.done = True
        return (now - self.start) / (DECIDE_AFTER_STEPS - WARMUP_STEPS)


@dataclass
class StepEnd:
    """What rank `rank` does after optimizer step `step`: the compile decision (`compile: when_it_pays`), the
    metrics line at `log_every` and the last step, the held-out τ probe when due, the training state at
    `checkpoint_every` and the last step."""

    job: TrainJob
    trainer: TrainStep
    window: Window
    probe: TauProbe | None
    clock: EagerClock
    rank: int
    log: Log | None
    write_kernels: Callable[[], None]
    last: dict[str, Any] = field(default_factory=dict)

    def __call__(self, step: int, g: int, epoch: int, total: int) -> None:
        train, stage, engine = self.job.train, Path(self.job.stage_dir), self.trainer.engine
        eager_s = self.clock.tick(step) if train.compile == "when_it_pays" else None
        if eager_s is not None:
            self.trainer.compile_if_it_pays(eager_s, total - step)
            self.write_kernels()
        if step % train.log_every == 0 or step == total:
            self.last = self.window.read(engine.get_lr()[0]) | {"step": step, "epoch": epoch, "total_steps": total}
            if self.rank == 0:
                with metrics_file(stage).open("a") as f:
                    f.write(json.dumps(self.last) + "\n")
                if self.log is not None:
                    self.log(self.last, step)
        if self.probe is not None and self.probe.due(step, total):  # before the checkpoint, which then covers it
            with self.window.paused():  # the next window's MFU is the training's
                self.probe.measure(step)
        if step % train.checkpoint_every == 0 or step == total:  # after the log: its loss ranks the state
            ckpt.save_training_state(engine, stage / "checkpoints", step, {"micro": g, "step": step}, _rank_state(g),
                                     loss=self.last.get("loss"), keep=train.keep_checkpoints)


def run_training(job: TrainJob, log: Log | None = None) -> dict[str, Any]:
    """Train one process's part of the job; rank 0 exports the drafter and returns the metrics."""
    rank, world, local = setup_distributed()
    train = job.train
    check_world(train, world)
    device = torch.device("cuda", local) if torch.cuda.is_available() else torch.device("cpu")
    stage = Path(job.stage_dir)
    (stage / "logs").mkdir(parents=True, exist_ok=True)
    target, tokenizer, drafter = _load_target(job, device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    ds = load_token_dataset(job.dataset)
    accum = train.grad_accum
    per_epoch = steps_per_epoch(len(ds), train.micro_batch, accum, world)
    if per_epoch < 1:
        raise ValueError(f"{job.dataset}: {len(ds)} rows cannot fill one global batch of {train.global_batch}")
    total = optimizer_steps(per_epoch, train.epochs, train.max_steps)
    trainer = TrainStep(job, target, drafter, total, device)

    def write_kernels() -> None:
        if rank == 0:
            atomic_write_text(stage / "logs" / "kernels.json", json.dumps(trainer.kernels, indent=2) + "\n")

    write_kernels()
    g = 0  # micro batches consumed (per rank)
    resumed = ckpt.load_training_state(trainer.engine, stage / "checkpoints", rank)
    if resumed is not None:
        client, rank_state = resumed
        g = int(client["micro"])
        _restore_rank_state(rank_state)
    step = g // accum
    window = Window(drafter.config.block_size, train.peak_flops, world, accum)
    if rank == 0:
        _trim_metrics(metrics_file(stage), step)
    end = StepEnd(job, trainer, window, TauProbe.of(job, target, drafter, rank, log), EagerClock(step), rank, log,
                  write_kernels)
    epoch_micro = per_epoch * accum
    if train.mode == "offline":
        trainer.features_of = _offline_features(job, trainer.capture, ds, rank, world, pad_id, device)
    while step < total:
        epoch, offset = divmod(g, epoch_micro)
        loader = make_loader(ds, train.micro_batch, rank, world, train.seed, epoch, offset, pad_id, train.max_length)
        for batch in loader:
            out = trainer.step(batch, epoch)
            g += 1
            window.add(out.loss, out.correct, out.count, out.tokens, out.flops, out.selector, out.selector_scale)
            if g % accum:
                continue
            step += 1
            end(step, g, epoch, total)
            if step >= total or g % epoch_micro == 0:
                break
    if rank == 0:
        ckpt.save_drafter(drafter, stage / "checkpoint", dtype=torch_dtype(train.precision))
        if end.probe is not None:
            end.probe.finish(stage / "checkpoint")
    return end.last | {"kernels": trainer.kernels}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="One DFlash training process (torchrun/deepspeed entry).")
    parser.add_argument("--stage-dir", required=True, help=f"train stage folder holding {JOB_FILE}")
    parser.add_argument("--run-dir", help="the pipeline run directory (informational)")
    parser.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)  # deepspeed launcher adds it
    args = parser.parse_args(argv)
    job_file = Path(args.stage_dir) / JOB_FILE
    if not job_file.is_file():
        raise SystemExit(f"{job_file}: missing; the train stage writes it before launching")
    run_training(TrainJob.model_validate_json(job_file.read_text()))
    teardown_distributed()  # not on error: a barrier with a failed peer would hang until timeout


if __name__ == "__main__":
    main()
