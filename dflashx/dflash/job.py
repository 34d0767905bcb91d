"""What one training process is given: the `TrainJob` (the resolved recipe's target, drafter and
train sections plus where the inputs are), the world check and the learning-rate schedule.

Public API: `TrainJob` (`.of(recipe, stage_dir, dataset, target_path)`, `.save()`), `JOB_FILE`,
`torch_dtype(precision)`, `check_world(train, world)`, `lr_schedule(train, total_steps)`,
`parameter_groups(train, module)`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import torch
from pydantic import BaseModel, ConfigDict

from dflashx.config.fields import TORCH_DTYPE
from dflashx.resolve.formulas import lr_factor, muon_engine_lr, warmup_steps
from dflashx.resolve.model import ResolvedDrafter, ResolvedRecipe, ResolvedTarget, ResolvedTrainStage
from dflashx.store.atomic import atomic_write_text

JOB_FILE = "train_job.json"


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
    def of(cls, recipe: ResolvedRecipe, stage_dir: str | Path, dataset: str | Path,
           target_path: str | Path) -> "TrainJob":
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
    """The learning-rate schedule DeepSpeed steps: warm-up, then `stages.train.schedule` (cosine or
    linear) to 0 over the measured steps; one factor for every parameter group's own peak rate."""
    warmup = warmup_steps(total_steps, train.warmup_ratio)
    return lambda optimizer: torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(train.schedule, step, total_steps, warmup))


def parameter_groups(train: ResolvedTrainStage, module: torch.nn.Module) -> list[dict[str, Any]]:
    """What the engine optimizes. AdamW: one group. Muon: the trainable matrices (2-D, what DeepSpeed
    tags `use_muon`) grouped by shape, each at its engine rate for the AdamW-matched `muon_lr`
    (`muon_engine_lr`), and the rest (norms) at `lr`."""
    params = [p for p in module.parameters() if p.requires_grad]
    if train.optimizer != "muon" or train.muon_lr is None:
        return [{"params": params}]
    shapes: dict[tuple[int, int], list[torch.nn.Parameter]] = {}
    for p in params:
        if p.ndim >= 2:
            shapes.setdefault((p.shape[0], math.prod(p.shape[1:])), []).append(p)
    groups = [{"params": ps, "lr": muon_engine_lr(train.muon_lr, r, c)} for (r, c), ps in shapes.items()]
    rest = [p for p in params if p.ndim < 2]
    return groups + ([{"params": rest, "lr": train.lr}] if rest else [])
