"""The train stage's DeepSpeed config and launch command: built once, at resolve time.

The config is the one the engine is built with, byte for byte (the trainer passes it unchanged;
a test compares them). The learning-rate schedule is not in it: its length depends on the
tokenized dataset, so the trainer builds it from the measured step count
(`dflashx.resolve.formulas.lr_factor`, linear warm-up over `warmup_ratio`, then cosine or linear
to 0).
"""

from __future__ import annotations

from typing import Any

from dflashx.config.schema import HardwareProfile, TrainStage
from dflashx.resolve.formulas import effective_batch

TRAIN_MODULE = "dflashx.stages.train"  # `python -m dflashx.stages.train --run-dir DIR` runs one rank
RUN_DIR = "{run_dir}"  # placeholder the train stage fills in
HOSTFILE = f"{RUN_DIR}/train/hostfile"  # the multi-node launch's hostfile; the train stage writes it
ADAM_BETAS = (0.9, 0.95)
QUIET_STEPS = 10**9  # DeepSpeed's own step printing: off (dflashx logs its own metrics)


def deepspeed_config(train: TrainStage, micro_batch: int, grad_accum: int, zero_stage: int, world_size: int,
                     bf16: bool, on_gpu: bool = True) -> dict[str, Any]:
    """ZeRO stage, bf16 or fp32, batch arithmetic, clipping, the optimizer (`optimizer_config`).

    Under Muon gradient clipping is off: DeepSpeed's ZeRO 1 and 2 clip the orthogonalised update
    (norm about sqrt(rank) per matrix), ZeRO 0 the raw gradient, so one `grad_clip` would train
    differently at each stage (measured on CPU: ZeRO 0 and ZeRO 2 losses parted from the first logged
    step); Muon's update has a fixed norm anyway.

    `master_weights: bf16` keeps master weights, gradients and Adam moments in bf16 (DeepSpeed's
    `bf16_master_weights_and_grads` + `bf16_optimizer_states`, ZeRO 1 or 2; the plan refuses ZeRO 0).
    """
    precision: dict[str, Any] = {"enabled": bf16}
    if bf16 and train.master_weights == "bf16":
        precision |= {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    return {
        "train_batch_size": effective_batch(micro_batch, grad_accum, world_size),
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": train.grad_clip if train.optimizer == "adamw" else 0.0,
        "zero_optimization": {"stage": zero_stage, "overlap_comm": world_size > 1, "contiguous_gradients": True},
        "bf16": precision,
        "optimizer": optimizer_config(train, on_gpu),
        "steps_per_print": QUIET_STEPS,
        "wall_clock_breakdown": False,
    }


def target_shard_config(hw: HardwareProfile, world_size: int, micro_batch: int, load_precision: str) -> dict[str, Any]:
    """The DeepSpeed config that partitions the frozen online target (`target_sharding: zero3`).

    ZeRO-3 with no optimizer is DeepSpeed's ZeRO-Inference: each rank keeps 1/world of every weight
    and gathers a layer's weights just before the layer runs, releasing them after
    (https://www.deepspeed.ai/2022/09/09/zero-inference.html). On several nodes ZeRO++'s hierarchical
    partitioning keeps a secondary copy per node, so those gathers stay on the node's links
    (`zero_hpz_partition_size` = GPUs per node; Wang et al. 2023, arXiv:2306.10209, section 3.2;
    https://www.deepspeed.ai/tutorials/zeropp/). The drafter keeps its own data-parallel engine
    (`deepspeed_config`). `bf16` follows the target's load precision.
    """
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "zero_optimization": {"stage": 3, "zero_hpz_partition_size": hw.gpus_per_node if hw.nodes > 1 else 1,
                              "overlap_comm": world_size > 1},
        "bf16": {"enabled": load_precision == "bf16"},
        "steps_per_print": QUIET_STEPS,
        "wall_clock_breakdown": False,
    }


def optimizer_config(train: TrainStage, on_gpu: bool = True) -> dict[str, Any]:
    """AdamW, or DeepSpeed's built-in Muon: Muon for the matrices DeepSpeed tags `use_muon` (2-D), its
    auxiliary AdamW for the rest. Under Muon `lr` is the AdamW half's; the matrices' rates are set per
    shape by the trainer's parameter groups from the resolved `muon_lr`
    (`dflashx.resolve.formulas.muon_engine_lr`), which override the config's.

    Every AdamW here is torch's (`torch_adam`), on every profile: DeepSpeed's own, its `fused_adam` op,
    is a C++/CUDA build at run time (nvcc, about 40 s per new machine, and on NVIDIA's images a crash:
    their `TORCH_CUDA_ARCH_LIST=9.0a` is not a list DeepSpeed can parse), for the same update
    (bias-corrected moments, decoupled weight decay; tests/test_torch_adam.py). On GPUs it is torch's fused
    CUDA kernel (`fused`): DeepSpeed passes it to AdamW's `torch.optim.AdamW`; Muon's AdamW half DeepSpeed
    builds with `foreach` alone, so the trainer switches that half to `fused` as this key says
    (`dflashx.dflash.step.make_engine`). That half is not small: under DFlash2 it holds the selector's two
    codebooks (2 x vocab x rank: 127M parameters for Qwen3.6-27B), beside the norms. On the CPU profile
    torch's default, its for-loop AdamW."""
    adam = {"lr": train.lr, "betas": list(ADAM_BETAS), "eps": 1e-8, "weight_decay": train.weight_decay,
            "torch_adam": True} | ({"fused": True} if on_gpu else {})
    if train.optimizer == "muon":
        return {"type": "Muon", "params": adam | {"momentum": train.muon_momentum}}
    return {"type": "AdamW", "params": adam}


def launch_argv(hw: HardwareProfile, world_size: int) -> list[str]:
    """`deepspeed` over the profile's GPUs (a hostfile for several nodes), `torchrun` otherwise."""
    worker = ["--module", TRAIN_MODULE, "--run-dir", RUN_DIR]
    if hw.gpu is None:
        return ["torchrun", "--standalone", "--nproc_per_node", str(world_size), "-m", TRAIN_MODULE,
                "--run-dir", RUN_DIR]
    if hw.nodes > 1:
        return ["deepspeed", "--hostfile", HOSTFILE, "--num_nodes", str(hw.nodes),
                "--num_gpus", str(hw.gpus_per_node), *worker]
    return ["deepspeed", "--num_gpus", str(hw.gpus_per_node), *worker]
