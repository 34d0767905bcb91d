"""The product's training step: one DeepSpeed engine over the drafter and its loss, and the step
that feeds it a micro batch. `run_training` and `benchmarks/train_step.py` both build it here, so
the benchmark times exactly what training runs.

A step: draw this epoch's anchors (`anchors.sample_anchors`), lay out the blocks, read the
target's features of the batch (online: `FeatureCapture`, stopped after the deepest tapped layer;
offline: the shards), run the drafter over all blocks in one pass under the per-anchor mask, the
fused LM-head cross-entropy on the supervised slots (DFlash2: plus the path selector's k-way
cross-entropy over the top-k candidates, ramped in: `dflashx.dflash.selector_loss`),
`engine.backward`, `engine.step`.

The objective (`stages.train.loss`: decay_ce or D-PACE), the label source (`stages.train.labels`:
the data, or the target's argmax from a full target forward) and the optimizer (`parameter_groups`:
AdamW, or Muon per matrix shape) are the resolved recipe's too.

The switches are the resolved recipe's, read as they are: `drafter.precision: fp8` (torchao float8
linears), `stages.train.compile` (compiled drafter layers; context widths and block counts padded
to buckets; `when_it_pays`: the trainer measures the first eager steps and calls `compile_if_it_pays`),
`stages.train.loss_kernel` (liger or torch; liger falls back to torch where liger-kernel
or CUDA is missing), and the DeepSpeed config. Until it compiles nothing is compiled, DeepSpeed's
Muon Newton-Schulz kernels included (their first inductor compile costs minutes on a CPU).

Public API: `make_engine(train, module, drafter, total_steps)` (the engine, as the trainer builds it;
`fuse_muon_adam_half(engine, config)`);
`TrainStep(job, target, drafter, total_steps, device)` — `step(batch, epoch) ->
StepResult`, `.engine`, `.capture`, `.features_of` (replaceable: offline features), `.kernels`
(which implementation of each switch runs, and whether the target is ZeRO-3 partitioned).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from dflashx.dflash.anchors import BlockBatch, build_block_batch, sample_anchors
from dflashx.dflash.architecture import torch_half
from dflashx.dflash.capture import FeatureCapture
from dflashx.dflash.job import TrainJob, lr_schedule, parameter_groups
from dflashx.dflash.kernels import bucketed, compile_layers, linear_attention_kernel, to_float8_training
from dflashx.dflash.loss import dflash_loss, liger_available, target_label_ids
from dflashx.dflash.masks import DraftMask
from dflashx.dflash.metrics import step_flops
from dflashx.dflash.model import DFlashDrafter
from dflashx.dflash.selector_loss import SelectorOutput, selector_ramp
from dflashx.dflash.target_shard import frozen_io, is_sharded
from dflashx.resolve.compile_rule import compile_pays
from dflashx.resolve.model import ResolvedTrainStage

LM_HEAD_CHUNK = 4096  # supervised tokens per chunk of the torch fused LM-head cross-entropy
CONTEXT_BUCKET = 256  # compiled drafter: context widths padded to a multiple of this
BLOCK_BUCKET = 64  # compiled drafter: blocks per sequence padded to a multiple of this
log = logging.getLogger(__name__)


class TrainModule(nn.Module):
    """What the engine wraps: the drafter and its loss; the frozen LM head comes in as a tensor."""

    def __init__(self, drafter: DFlashDrafter, chunk: int, loss_kernel: str, objective: str, dpace_alpha: float):
        super().__init__()
        self.drafter, self.chunk, self.loss_kernel = drafter, chunk, loss_kernel
        self.objective, self.dpace_alpha = objective, dpace_alpha

    def forward(self, block_embeds, features, batch, context_positions, mask, lm_head_weight,
                selector_scale: float = 0.0, gold_missing: str = "skip"):
        """(loss to backpropagate, the backbone's `LossOutput`, the architecture's extra term or None): the
        backbone's loss, + selector_scale x the architecture's own term (`TorchHalf.extra_loss`: DFlash2's selector
        loss; DFlash has none)."""
        d = self.drafter
        half = torch_half(d.config.architecture)
        hidden = d(block_embeds, d.fuse(features), batch.block_positions, context_positions, mask)
        head = lm_head_weight.to(hidden.dtype)
        out = dflash_loss(hidden, head, batch.labels, batch.weights, d.config.block_size, self.chunk,
                          self.loss_kernel, self.objective, self.dpace_alpha, half.loss_top_k(d))
        extra = half.extra_loss(d, out, batch, head, gold_missing, self.chunk)
        if extra is None:
            return out.loss, out, None
        return out.loss + selector_scale * extra.loss, out, extra


@dataclass
class StepResult:
    """One micro step: the loss, per-slot correct and supervised counts [B], target tokens, useful FLOPs."""

    loss: torch.Tensor
    correct: torch.Tensor
    count: torch.Tensor
    tokens: int
    flops: float
    selector: SelectorOutput | None = None  # DFlash2: the selector's loss and per-slot sums
    selector_scale: float = 0.0  # DFlash2: the selector loss's weight this step (selector_weight x ramp)


def make_engine(train: ResolvedTrainStage, module: nn.Module, drafter: nn.Module, total_steps: int) -> Any:
    """The DeepSpeed engine over `module`: the resolved config as it is (every AdamW torch's, fused on GPUs: no
    op is compiled, `dflashx.resolve.deepspeed.optimizer_config`), the drafter's parameter groups
    (`parameter_groups`) and the learning-rate schedule over `total_steps`."""
    import deepspeed

    engine, _, _, _ = deepspeed.initialize(model=module, config=train.deepspeed_config,
                                           model_parameters=parameter_groups(train, drafter),
                                           lr_scheduler=lr_schedule(train, total_steps))
    fuse_muon_adam_half(engine, train.deepspeed_config)
    return engine


def fuse_muon_adam_half(engine: Any, config: dict[str, Any]) -> None:
    """Muon's AdamW half on torch's fused kernel when the config's optimizer says `fused`: DeepSpeed builds that
    half as `torch.optim.AdamW(groups, foreach=...)` and drops the key. Set before the first step, as the
    constructor would (the per-parameter `step` then lives on the device); torch checks each parameter's
    device and dtype for the fused kernel at every step (`_device_dtype_check_for_fused`)."""
    adam = getattr(getattr(engine, "basic_optimizer", None), "aux_optimizer", None)
    if adam is None or not config.get("optimizer", {}).get("params", {}).get("fused"):
        return
    adam.defaults["fused"] = True
    for group in adam.param_groups:
        group["fused"] = True


class TrainStep:
    """The drafter (FP8 and compiled as resolved) inside its DeepSpeed engine, and one micro step."""

    def __init__(self, job: TrainJob, target: nn.Module, drafter: DFlashDrafter, total_steps: int,
                 device: torch.device):
        train, self.job, self.device, self.cfg = job.train, job, device, drafter.config
        self.total_steps = total_steps
        self.capture = FeatureCapture(target, self.cfg.target_layer_ids)
        self.embed, self.lm_head_w = frozen_io(target)  # whole copies when the target is sharded
        loss_kernel = train.loss_kernel
        if loss_kernel == "liger" and not liger_available():
            log.warning("stages.train.loss_kernel is liger but liger-kernel or CUDA is missing: torch fused loss")
            loss_kernel = "torch"
        fp8 = to_float8_training(drafter) if job.drafter.precision == "fp8" else 0
        self.drafter, self.compiled = drafter, False
        self.buckets, self.attention = (1, 1), "sdpa"
        self.kernels: dict[str, Any] = {"compile": False, "attention": "sdpa", "fp8_linears": fp8,
                                        "loss_kernel": loss_kernel, "linear_attention": linear_attention_kernel(target),
                                        "target_sharding": "zero3" if is_sharded(target) else "none"}
        if train.compile == "on":
            self.compile()
        self.engine = make_engine(train, TrainModule(drafter, LM_HEAD_CHUNK, loss_kernel, train.loss,
                                                     train.dpace_alpha), drafter, total_steps)
        drafter.restore_rope()
        self.features_of: Callable[[dict[str, torch.Tensor]], torch.Tensor] = self.online_features

    def compile(self) -> None:
        """Compile the drafter's layers in place (before or after the engine is built: same parameters), pad
        lengths to buckets, and attend through compiled flex attention on CUDA. Flex attention pays only
        compiled (uncompiled it materialises the scores, as SDPA's dense mask does), so an eager step uses
        the dense mask and compiles nothing."""
        compile_layers(self.drafter)
        self.compiled, self.buckets = True, (CONTEXT_BUCKET, BLOCK_BUCKET)
        self.attention = "flex" if self.device.type == "cuda" else "sdpa"
        self.kernels |= {"compile": True, "attention": self.attention}

    def compile_if_it_pays(self, eager_step_seconds: float, remaining_steps: int) -> bool:
        """`compile: when_it_pays`: compile now if the steps left pay for it (`resolve.compile_rule`);
        True when it compiled."""
        if self.job.train.compile != "when_it_pays" or self.compiled:
            return False
        pays = compile_pays(eager_step_seconds, remaining_steps)
        self.kernels["compile_rule"] = {"eager_step_s": eager_step_seconds, "remaining_steps": remaining_steps,
                                        "pays": pays}
        if pays:
            self.compile()
        return pays

    def online_features(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The target's tapped features [b, L, k*H] of the batch (forward stopped after the deepest layer)."""
        return self.capture.capture(batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device))

    def target_features_and_labels(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """`labels: target`: the tapped features and the batch's ids with every supervised position
        replaced by the target's argmax there, from one full target forward."""
        ids = batch["input_ids"].to(self.device)
        features, final = self.capture.capture_with_final(ids, batch["attention_mask"].to(self.device))
        return features, target_label_ids(ids, batch["loss_mask"].to(self.device), final, self.lm_head_w).cpu()

    def blocks(self, batch: dict[str, torch.Tensor], lengths: list[int], epoch: int,
               label_ids: torch.Tensor | None = None) -> BlockBatch:
        """This epoch's anchors for each row of the micro batch, laid out as blocks."""
        train = self.job.train
        anchors = [sample_anchors(batch["loss_mask"][i, :n], train.anchors_per_seq, train.seed, epoch,
                                  int(batch["index"][i])) for i, n in enumerate(lengths)]
        return build_block_batch(batch["input_ids"], batch["loss_mask"], anchors, self.cfg.block_size,
                                 self.cfg.mask_token_id, train.loss_gamma, pad_blocks_to=self.buckets[1],
                                 label_ids=label_ids)

    def step(self, batch: dict[str, torch.Tensor], epoch: int) -> StepResult:
        """One micro step of the engine on a collated batch (input_ids, loss_mask, attention_mask, index)."""
        lengths = batch["attention_mask"].sum(1).tolist()
        labels = self.job.train.labels
        if labels == "target":
            features, label_ids = self.target_features_and_labels(batch)
        else:
            features, label_ids = self.features_of(batch), None
        blocks = self.blocks(batch, lengths, epoch, label_ids).to(self.device)
        width = bucketed(features.shape[1], self.buckets[0])
        if width > features.shape[1]:  # padded context keys are never visible (p < anchor)
            features = F.pad(features, (0, 0, 0, width - features.shape[1]))
        positions = torch.arange(width, device=self.device).expand(len(lengths), -1)
        mask = DraftMask(blocks.anchors, width, self.cfg.block_size, backend=self.attention)
        scale = self.selector_scale()
        total, out, sel = self.engine(self.embed(blocks.block_ids), features, blocks, positions, mask,
                                      self.lm_head_w, scale, self.job.train.selector_gold_missing)
        self.engine.backward(total)
        with torch._dynamo.config.patch(disable=not self.compiled):  # DeepSpeed's Muon kernels too
            self.engine.step()
        flops = step_flops(self.job.target.facts, self.cfg, lengths, blocks, labels,
                           int(batch["loss_mask"][:, 1:].sum()))
        return StepResult(out.loss, out.correct, out.count, sum(lengths), flops, sel, scale)

    def selector_scale(self) -> float:
        """The architecture's extra loss weight for the engine's current optimizer step (DFlash2: selector_weight
        x the ramp; a resumed engine restores its step count, so the ramp continues where it stopped); 0 for
        DFlash, which has no extra term."""
        train = self.job.train
        ramp = selector_ramp(self.engine.global_steps, self.total_steps, train.selector_warmup_ratio)
        return torch_half(self.cfg.architecture).extra_loss_weight(train.selector_weight, ramp)
