"""Held-out τ while training: every planned `tau_every` optimizer steps (`TrainJob.tau_every`) and at the
last one, rank 0 decodes the held-out slice greedily with the drafter as it stands.

The slice (`TrainJob.heldout`) is the first `tau_prompts` prompts of the ingest stage's held-out split
(the ones the eval stage's `heldout` suite starts with, unless `stages.eval.prompts` names another file),
chat template applied, each decoded up to
`tau_max_new_tokens` new tokens with the eval stage's decoder (`dflashx.dflash.batch_decode.BatchDecoder`:
the slice as one batch, temperature 0, the same stop tokens; greedy, each prompt's output and cycles are
`SpecDecoder`'s); τ is pooled over the prompts as the eval stage counts it
(`dflashx.dflash.acceptance.summarize`). The measurement is one line of `logs/metrics.jsonl`
(`heldout_tau`, ...; `dflashx.dflash.tau_record.tau_row`), logged like the windows (records, W&B).
A measurement at least as high as the best so far, or one at or before the best's step (a resumed run
measuring again what a killed one had measured), replaces `best-tau/`
(`dflashx.dflash.checkpoint.save_best_tau`); `finish` writes the curve, the best and the last into the
exported checkpoint (`checkpoint/tau.json`) and the best drafter into `checkpoint/best/` when it is not
the last.

Collectives: the other ranks wait at a barrier while rank 0 decodes; the drafter's weights are whole on
every rank (ZeRO 0-2) and rank 0's target is its own copy, so the decode runs no collective (a target
sharded with ZeRO-3 is refused by the plan: `tau_sharded`). The RNG states are forked around the decode,
so a run measures the same losses as one that does not measure.

Resume: lines after the resumed checkpoint's step are trimmed with the windows and measured again;
`best-tau/` is kept until the resumed run measures its step again, which replaces it whatever τ it finds
(bit-for-bit repeatable on the CPU; on GPUs the repeated steps need not be, so the kept best is always one
the finished run's curve holds). A kill between the two renames of its replacement leaves the old folder
aside, which `best_tau` puts back.

Public API: `TauProbe.of(job, target, drafter, rank, log) -> TauProbe | None` (None: not measured), `.due(step,
total)`, `.measure(step)`, `.finish(checkpoint_dir) -> HeldOutTau | None`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, cast

import torch
from torch import nn

from dflashx.dflash.acceptance import summarize
from dflashx.dflash.checkpoint import BEST_TAU, best_tau, copy_drafter, save_best_tau
from dflashx.dflash.job import HeldOutSlice, TrainJob, torch_dtype
from dflashx.dflash.model import DFlashDrafter
from dflashx.dflash.tau_record import BEST_DIR, HeldOutTau, curve_of, metrics_file, tau_row
from dflashx.resolve.tau import TauPoint

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Log = Callable[[dict[str, Any], int], None]


class TauProbe:
    def __init__(self, job: TrainJob, every: int, heldout: HeldOutSlice, target: nn.Module, drafter: DFlashDrafter,
                 rank: int, log: Log | None):
        self.job, self.every, self.heldout = job, every, heldout
        self.target, self.drafter, self.rank, self.log = target, drafter, rank, log
        self.stage = Path(job.stage_dir)
        self.metrics = metrics_file(self.stage)

    @classmethod
    def of(cls, job: TrainJob, target: nn.Module, drafter: DFlashDrafter, rank: int,
           log: Log | None) -> "TauProbe | None":
        every, heldout = job.tau_every, job.heldout
        if not every or heldout is None or not heldout.prompts:
            return None
        return cls(job, every, heldout, target, drafter, rank, log)

    def due(self, step: int, total: int) -> bool:
        return step % self.every == 0 or step == total

    def _decode(self) -> tuple[dict[str, Any], int]:
        from dflashx.dflash.batch_decode import BatchDecoder

        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        training = self.drafter.training
        # eager: a compiled drafter's layers would recompile for decoding's shapes and grad mode (on an H100 the
        # tiny recipe's first probe took 19 s compiling, the next ones 0.2-0.3 s each), and decoding is the
        # eval stage's eager loop anyway
        with torch.random.fork_rng(devices=devices), torch.compiler.set_stance("force_eager"):
            decoder = BatchDecoder(cast("PreTrainedModel", self.target), self.drafter)  # a loaded HF target (no shard)
            results = decoder.generate(self.heldout.prompts, self.job.train.tau_max_new_tokens, 0.0,
                                       self.heldout.stop_ids)
        self.drafter.train(training)
        return summarize(results, self.drafter.config.block_size), decoder.cycles

    def measure(self, step: int) -> None:
        """Rank 0 decodes the slice, logs the line and keeps the drafter when it is the best so far; every
        rank leaves together."""
        import torch.distributed as dist

        if self.rank == 0:
            start = time.perf_counter()
            summary, cycles = self._decode()
            point = TauPoint(step=step, tau=summary["tau"])
            row = tau_row(point, heldout_accepted_plus_one=summary["accepted_plus_one"],
                          heldout_acceptance_by_position=summary["acceptance_by_position"],
                          heldout_prompts=summary["prompts"], heldout_seconds=time.perf_counter() - start,
                          heldout_decode_cycles=cycles)
            with self.metrics.open("a") as f:
                f.write(json.dumps(row) + "\n")
            if self.log is not None:
                self.log(row, step)
            best = best_tau(self.stage)
            if best is None or point.tau >= best.tau or point.step <= best.step:
                save_best_tau(self.drafter, self.stage, point, torch_dtype(self.job.train.precision))
        if dist.is_initialized():
            dist.barrier()

    def finish(self, checkpoint: Path) -> HeldOutTau | None:
        """Rank 0, after the last drafter is in `checkpoint`: its `tau.json`, and the best drafter in
        `best/` when the best is not the last."""
        best, curve = best_tau(self.stage), curve_of(self.metrics)
        if best is None or not curve:
            return None
        record = HeldOutTau.of(curve, best, len(self.heldout.prompts), self.job.train.tau_max_new_tokens)
        if record.exported == "best":
            copy_drafter(self.stage / BEST_TAU, checkpoint / BEST_DIR)
        record.write(checkpoint)
        return record
