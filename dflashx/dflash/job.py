"""What one training process is given: the `TrainJob` (the resolved recipe's target, drafter and
train sections plus where the inputs are), the world check and the learning-rate schedule.

Public API: `TrainJob` (`.of(recipe, stage_dir, dataset, target_path, tokenizer_path, heldout=None)`,
`.save()`), `HeldOutSlice`, `JOB_FILE`,
`torch_dtype(precision)`, `check_world(train, world)`, `lr_schedule(train, total_steps)`,
`parameter_groups(train, module)`.
"""

from __future__ import annotations

from collections.abc import Iterator
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


class HeldOutSlice(BaseModel):
    """The held-out prompts a τ measurement decodes (chat template applied, token ids) and where a decode
    stops: what the train stage reads off the ingest stage's held-out split for `dflashx.dflash.tau_probe`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompts: list[list[int]]
    stop_ids: list[int]


class TrainJob(BaseModel):
    """Everything one training process needs: where things are, and the resolved recipe's
    target, drafter and train sections as they are (written as JSON for launched processes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage_dir: str
    dataset: str
    target_path: str  # the folder (or hub id) the target loads from
    tokenizer_path: str  # the folder (or hub id) its tokenizer loads from: target.tokenizer when set
    target: ResolvedTarget
    drafter: ResolvedDrafter
    train: ResolvedTrainStage
    heldout: HeldOutSlice | None = None  # None: no held-out τ measured (no held-out prompts, or tau_every 0)
    tau_every: int = 0  # the planned held-out τ interval (the plan's `stage("train").tau_every`); 0: none

    @classmethod
    def of(cls, recipe: ResolvedRecipe, stage_dir: str | Path, dataset: str | Path, target_path: str | Path,
           tokenizer_path: str | Path, heldout: HeldOutSlice | None = None, tau_every: int | None = None) -> "TrainJob":
        """`tau_every`: the plan's interval (the train stage's); None takes the recipe's own value (a job built
        without a plan: tests, benchmarks)."""
        every = (recipe.stages.train.tau_every or 0) if tau_every is None else tau_every
        return cls(stage_dir=str(stage_dir), dataset=str(dataset), target_path=str(target_path),
                   tokenizer_path=str(tokenizer_path), target=recipe.target, drafter=recipe.drafter,
                   train=recipe.stages.train, heldout=heldout, tau_every=every)

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


def muon_matrices(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The trainable parameters Muon orthogonalises: the hidden matrices, 2-D weights other than
    embedding tables. Left to AdamW: norms (1-D); DFlash2's selector codebooks (`nn.Embedding`, V x r:
    lookup tables whose row b moves only when token b is a predecessor or candidate; Muon's
    orthogonalised update is for hidden layers, embeddings and heads go to AdamW: Keller Jordan's Muon
    write-up, kellerjordan.github.io/posts/muon/#empirical-considerations, which DeepSpeed's name rule
    follows, deepspeedai/DeepSpeed#7641); their convolutions' `base_kernel` [2, K, H] (per-channel
    taps starting at the identity, gains like a norm's weight: Muon would orthogonalise them as one
    [2, K*H] matrix, mixing the two sides' kernels)."""
    tables = {id(m.weight) for m in module.modules() if isinstance(m, torch.nn.Embedding)}
    return [p for p in module.parameters() if p.requires_grad and p.ndim == 2 and id(p) not in tables]


def parameter_groups(train: ResolvedTrainStage, module: torch.nn.Module) -> Iterator[dict[str, Any]]:
    """What the engine optimizes. AdamW: one group. Muon: the matrices (`muon_matrices`) grouped by
    shape, each at its engine rate for the AdamW-matched `muon_lr` (`muon_engine_lr`), and the rest
    (norms, embedding tables, DFlash2's 3-D conv kernels) at `lr`.

    Lazy, and it tags `p.use_muon` as it is read: `deepspeed.initialize` tags every parameter by name
    (2-D and no "embed" / "lm_head" in it, `deepspeed.set_optimizer_flags`), overwriting earlier tags,
    and would take the published `candidate_selector.*_codebook` and the 3-D kernels for Muon matrices;
    the engine reads a lazy `model_parameters` after that tagging (DeepSpeedEngine.__init__: "A lazy
    iterable remains valid ..."), so these tags are the ones its Muon groups are split by."""
    params = [p for p in module.parameters() if p.requires_grad]
    muon = train.optimizer == "muon"
    matrices = {id(p) for p in muon_matrices(module)} if muon else set()
    if muon:
        for p in params:
            p.use_muon = id(p) in matrices  # type: ignore[attr-defined]
    if not muon or train.muon_lr is None:
        yield {"params": params}
        return
    shapes: dict[tuple[int, int], list[torch.nn.Parameter]] = {}
    for p in params:
        if id(p) in matrices:
            shapes.setdefault((p.shape[0], p.shape[1]), []).append(p)
    for (r, c), ps in shapes.items():
        yield {"params": ps, "lr": muon_engine_lr(train.muon_lr, r, c)}
    rest = [p for p in params if id(p) not in matrices]
    if rest:
        yield {"params": rest, "lr": train.lr}
