"""Online (or offline) DFlash training on a DeepSpeed engine, in-process or one process per GPU.

Every rank holds its own frozen target copy and its own shard of the data (DistributedSampler);
the drafter is the only module DeepSpeed manages (ZeRO 0/1/2, bf16 or fp32, gradient
accumulation, AdamW + warm-up cosine, clipping), built with the resolved recipe's DeepSpeed config
exactly as the plan prints it; the job (`TrainJob`) is the resolved target, drafter and train
sections plus where the inputs are, and the trainer re-derives none of their values.

Entry points:
  `run_training(job, log=None) -> dict` — one process of the job (rank from the environment,
  or a one-rank group: `dflashx.dflash.distributed`);
  `python -m dflashx.dflash.trainer --stage-dir DIR [--run-dir DIR]` — the same from
  `DIR/train_job.json`, for torchrun / the deepspeed launcher.
Outputs in the stage folder: `checkpoints/` (atomic DeepSpeed states + `latest`), `checkpoint/`
(the drafter in the exported DFlash layout), `logs/metrics.jsonl` (one line per log step).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from dflashx.config.fields import TORCH_DTYPE
from dflashx.dflash import checkpoint as ckpt
from dflashx.dflash.anchors import BlockBatch, build_block_batch, sample_anchors
from dflashx.dflash.capture import FeatureCapture
from dflashx.dflash.config import DFlashConfig, text_config
from dflashx.dflash.data import load_token_dataset, make_loader, micro_batches_per_epoch
from dflashx.dflash.distributed import setup_distributed, teardown_distributed
from dflashx.dflash.loss import accuracy_per_position, dflash_loss, expected_acceptance_length
from dflashx.dflash.masks import DraftMask
from dflashx.dflash.metrics import peak_memory_bytes, step_flops
from dflashx.dflash.model import DFlashDrafter
from dflashx.resolve.formulas import warmup_cosine, warmup_steps
from dflashx.resolve.model import ResolvedDrafter, ResolvedRecipe, ResolvedTarget, ResolvedTrainStage
from dflashx.store.atomic import atomic_write_text

JOB_FILE = "train_job.json"
LM_HEAD_CHUNK = 4096  # block tokens per chunk of the fused LM-head cross-entropy
Log = Callable[[dict[str, Any], int], None]


def torch_dtype(precision: str) -> torch.dtype:
    return getattr(torch, TORCH_DTYPE[precision])


class TrainJob(BaseModel):
    """Everything one training process needs: where things are, and the resolved recipe's
    target, drafter and train sections as they are (written as JSON for launched processes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage_dir: str
    dataset: str
    target_path: str  # the folder (or hub id) the target loads from
    target: ResolvedTarget
    drafter: ResolvedDrafter
    train: ResolvedTrainStage

    @classmethod
    def of(cls, recipe: ResolvedRecipe, stage_dir: str | Path, dataset: str | Path, target_path: str | Path) -> "TrainJob":
        return cls(stage_dir=str(stage_dir), dataset=str(dataset), target_path=str(target_path),
                   target=recipe.target, drafter=recipe.drafter, train=recipe.stages.train)

    def save(self) -> Path:
        path = Path(self.stage_dir) / JOB_FILE
        atomic_write_text(path, self.model_dump_json(indent=2))
        return path


def check_world(train: ResolvedTrainStage, world: int) -> None:
    """The process group must be the world the plan resolved the batch arithmetic for."""
    if world != train.world_size:
        raise ValueError(
            f"{world} training processes, but the plan resolved stages.train for {train.world_size} "
            f"(micro_batch {train.micro_batch} x grad_accum {train.grad_accum}); launch "
            f"{train.world_size} processes, or re-plan with the hardware profile of this machine"
        )


def lr_schedule(train: ResolvedTrainStage, total_steps: int) -> Callable[[torch.optim.Optimizer], Any]:
    """The learning-rate schedule DeepSpeed steps: warm-up then cosine over the measured steps."""
    warmup = warmup_steps(total_steps, train.warmup_ratio)
    return lambda optimizer: torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, total_steps, warmup))


class _TrainModule(nn.Module):
    """What the engine wraps: the drafter and its loss; the frozen LM head comes in as a tensor."""

    def __init__(self, drafter: DFlashDrafter, chunk: int):
        super().__init__()
        self.drafter, self.chunk = drafter, chunk

    def forward(self, block_embeds, features, batch, context_positions, mask, lm_head_weight):
        d = self.drafter
        hidden = d(block_embeds, d.fuse(features), batch.block_positions, context_positions, mask)
        out = dflash_loss(hidden, lm_head_weight.to(hidden.dtype), batch.labels, batch.weights, d.config.block_size,
                          self.chunk)
        return out.loss, out.correct, out.count


def _load_target(job: TrainJob, device: torch.device) -> tuple[nn.Module, Any, DFlashDrafter]:
    """The frozen target on `device`, its tokenizer, and the drafter built for it.

    `target.precision: fp8`: the linear layers the capture runs (decoder layers up to the deepest
    tapped one) are converted to FP8 while the weights are still in host memory, so the GPU never
    holds the bf16 copies; layers past the deepest tapped one never run.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(job.target_path, dtype=torch_dtype(job.target.load_precision))
    tokenizer = AutoTokenizer.from_pretrained(job.target_path)
    drafter = build_drafter(job, target.config, tokenizer).to(device)
    if job.target.load_precision == "fp8":
        from dflashx.dflash.fp8 import target_to_fp8

        swapped = target_to_fp8(target, device, depth=max(drafter.config.target_layer_ids) + 1)
        logging.getLogger(__name__).info("target in FP8: %d linear layers", swapped)
    return target.to(device).eval().requires_grad_(False), tokenizer, drafter


def build_drafter(job: TrainJob, target_config: Any, tokenizer: Any) -> DFlashDrafter:
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
    fresh = DFlashConfig.from_target(job.drafter, target_config,
                                     tokenizer.convert_ids_to_tokens(mask) if mask < len(tokenizer) else None)
    torch.manual_seed(job.train.seed)
    return DFlashDrafter(fresh)


def _rank_state(g: int) -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(), "micro": g}


def _restore_rank_state(state: dict[str, Any]) -> None:
    if state:
        torch.set_rng_state(state["torch"])
        np.random.set_state(state["numpy"])
        random.setstate(state["python"])


class _Window:
    """Sums of loss, slot accuracy, tokens and FLOPs over the micro steps since the last log;
    `read` all-reduces them over the ranks."""

    def __init__(self, block_size: int, peak_flops: float, world: int, micro_per_step: int):
        self.block_size, self.peak_flops, self.world = block_size, peak_flops, world
        self.micro_per_step = micro_per_step
        self.reset()

    def reset(self) -> None:
        self.device_sums: torch.Tensor | None = None  # loss, correct[B], count[B]: stays on the device
        self.host = [0.0, 0.0, 0.0]  # micro steps, tokens, flops
        self.start = time.perf_counter()

    def add(self, loss: torch.Tensor, correct: torch.Tensor, count: torch.Tensor, tokens: float, flops: float) -> None:
        vec = torch.cat([loss.detach().float().view(1), correct.float(), count.float()])
        self.device_sums = vec if self.device_sums is None else self.device_sums + vec
        self.host = [self.host[0] + 1, self.host[1] + tokens, self.host[2] + flops]

    def read(self, lr: float) -> dict[str, Any]:
        import torch.distributed as dist

        sums = self.device_sums if self.device_sums is not None else torch.zeros(1 + 2 * self.block_size)
        packed = torch.cat([sums.double(), torch.tensor(self.host, dtype=torch.float64, device=sums.device)])
        if dist.is_initialized() and self.world > 1:
            dist.all_reduce(packed)
        packed = packed.cpu()
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        b = self.block_size
        loss, correct, count = float(packed[0]), packed[1 : 1 + b], packed[1 + b : 1 + 2 * b]
        n, tokens, flops = packed[1 + 2 * b :].tolist()
        acc = accuracy_per_position(correct, count)
        steps = max(n, 1) / self.micro_per_step
        self.reset()
        return {"loss": loss / max(n, 1), "lr": lr, "accuracy": acc, "acceptance_length": expected_acceptance_length(acc),
                "tokens_per_s": tokens / elapsed, "flops_per_step": flops / steps, "tflops": flops / elapsed / 1e12,
                "mfu": flops / elapsed / (self.peak_flops * self.world), "memory_bytes": peak_memory_bytes()}


def _trim_metrics(path: Path, step: int) -> None:
    """Drop lines logged after the checkpoint a resumed run starts from (they will be redone)."""
    if path.exists():
        keep = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= step]
        atomic_write_text(path, "".join(f"{line}\n" for line in keep))


def _blocks(batch: dict[str, torch.Tensor], lengths: list[int], train: ResolvedTrainStage, cfg: DFlashConfig,
            epoch: int) -> BlockBatch:
    """This epoch's anchors for each row of the micro batch, laid out as blocks."""
    anchors = [sample_anchors(batch["loss_mask"][i, :n], train.anchors_per_seq, train.seed, epoch, int(batch["index"][i]))
               for i, n in enumerate(lengths)]
    return build_block_batch(batch["input_ids"], batch["loss_mask"], anchors, cfg.block_size, cfg.mask_token_id,
                             train.loss_gamma)


def _feature_source(job: TrainJob, capture: FeatureCapture, ds: Any, rank: int, world: int, pad_id: int,
                    device: torch.device) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    """Online: run the target's tapped layers per batch. Offline: write shards once, then read."""
    if job.train.mode != "offline":
        return lambda batch: capture.capture(batch["input_ids"].to(device), batch["attention_mask"].to(device))
    from dflashx.dflash.offline import OfflineFeatures, write_features

    folder = Path(job.stage_dir) / "features"
    write_features(capture, ds, folder, rank, world, pad_id, job.train.max_length, device)
    store = OfflineFeatures(folder)
    return lambda batch: store.batch(batch["index"].tolist(), batch["input_ids"].shape[1]).to(device)


def run_training(job: TrainJob, log: Log | None = None) -> dict[str, Any]:
    """Train one process's part of the job; rank 0 exports the drafter and returns the metrics."""
    import deepspeed

    rank, world, local = setup_distributed()
    train = job.train
    check_world(train, world)
    device = torch.device("cuda", local) if torch.cuda.is_available() else torch.device("cpu")
    stage = Path(job.stage_dir)
    (stage / "logs").mkdir(parents=True, exist_ok=True)
    target, tokenizer, drafter = _load_target(job, device)
    cfg = drafter.config
    capture = FeatureCapture(target, cfg.target_layer_ids)
    embed, lm_head_w = target.get_input_embeddings(), target.get_output_embeddings().weight
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    ds = load_token_dataset(job.dataset)
    per_epoch = micro_batches_per_epoch(len(ds), train.micro_batch, world)
    accum = train.grad_accum
    if per_epoch < accum:
        raise ValueError(f"{job.dataset}: {len(ds)} rows cannot fill one global batch of {train.global_batch}")
    steps_per_epoch = per_epoch // accum
    total = train.max_steps or max(1, math.ceil(train.epochs * steps_per_epoch))
    engine, _, _, _ = deepspeed.initialize(model=_TrainModule(drafter, LM_HEAD_CHUNK), config=train.deepspeed_config,
                                           model_parameters=[p for p in drafter.parameters() if p.requires_grad],
                                           lr_scheduler=lr_schedule(train, total))
    drafter.restore_rope()

    g = 0  # micro batches consumed (per rank)
    resumed = ckpt.load_training_state(engine, stage / "checkpoints", rank)
    if resumed is not None:
        client, rank_state = resumed
        g = int(client["micro"])
        _restore_rank_state(rank_state)
    step = g // accum
    window = _Window(cfg.block_size, train.peak_flops, world, accum)
    metrics_file = stage / "logs" / "metrics.jsonl"
    if rank == 0:
        _trim_metrics(metrics_file, step)
    last: dict[str, Any] = {}

    epoch_micro = steps_per_epoch * accum
    features_of = _feature_source(job, capture, ds, rank, world, pad_id, device)
    while step < total:
        epoch, offset = divmod(g, epoch_micro)
        loader = make_loader(ds, train.micro_batch, rank, world, train.seed, epoch, offset, pad_id, train.max_length)
        for batch in loader:
            lengths = batch["attention_mask"].sum(1).tolist()
            blocks = _blocks(batch, lengths, train, cfg, epoch).to(device)
            width = batch["input_ids"].shape[1]
            positions = torch.arange(width, device=device).expand(len(lengths), -1)
            mask = DraftMask(blocks.anchors, width, cfg.block_size)
            loss, correct, count = engine(embed(blocks.block_ids), features_of(batch), blocks, positions, mask, lm_head_w)
            engine.backward(loss)
            engine.step()
            g += 1
            window.add(loss, correct, count, sum(lengths), step_flops(job.target.facts, cfg, lengths, blocks))
            if g % accum:
                continue
            step += 1
            if step % train.log_every == 0 or step == total:
                last = window.read(engine.get_lr()[0]) | {"step": step, "epoch": epoch, "total_steps": total}
                if rank == 0:
                    with metrics_file.open("a") as f:
                        f.write(json.dumps(last) + "\n")
                    if log is not None:
                        log(last, step)
            if step % train.checkpoint_every == 0 or step == total:  # after the log: its loss ranks the state
                ckpt.save_training_state(engine, stage / "checkpoints", step, {"micro": g, "step": step}, _rank_state(g),
                                         loss=last.get("loss"), keep=train.keep_checkpoints)
            if step >= total or g % epoch_micro == 0:
                break
    if rank == 0:
        ckpt.save_drafter(drafter, stage / "checkpoint", dtype=torch_dtype(train.precision))
    return last


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
