"""The DeepSpeed JSON config and the launch command of the train stage."""

from __future__ import annotations

import math
import shlex
from typing import Any

from dflashx.config.schema import Recipe
from dflashx.plan.derive import Derived

TRAIN_MODULE = "dflashx.stages.train"  # `python -m dflashx.stages.train --run-dir DIR` runs one rank
RUN_DIR = "{run_dir}"  # placeholder the orchestrator fills in


def deepspeed_config(recipe: Recipe, d: Derived, steps: int) -> dict[str, Any]:
    """ZeRO stage, bf16 (fp32 on the CPU profile), batch arithmetic, clipping, AdamW, warmup-cosine."""
    train = recipe.stages.train
    bf16 = recipe.hardware.gpu is not None and recipe.target.precision != "fp32"
    return {
        "train_batch_size": train.global_batch,
        "train_micro_batch_size_per_gpu": d.micro_batch,
        "gradient_accumulation_steps": d.grad_accum,
        "gradient_clipping": train.grad_clip,
        "zero_optimization": {"stage": d.zero_stage, "overlap_comm": d.world_size > 1, "contiguous_gradients": True},
        "bf16": {"enabled": bf16},
        "fp16": {"enabled": False},
        "optimizer": {"type": "AdamW", "params": {"lr": train.lr, "betas": [0.9, 0.999], "eps": 1e-8,
                                                  "weight_decay": train.weight_decay}},
        "scheduler": {"type": "WarmupCosineLR", "params": {
            "total_num_steps": max(steps, 1),
            "warmup_num_steps": math.ceil(train.warmup_ratio * steps),
            "warmup_type": "linear",
            "warmup_min_ratio": 0.0,
            "cos_min_ratio": 0.0,
        }},
        "steps_per_print": train.log_every,
        "wall_clock_breakdown": False,
    }


def launch(recipe: Recipe, d: Derived) -> dict[str, Any]:
    """`deepspeed` over the profile's GPUs (a hostfile for several nodes), `torchrun` on the CPU."""
    hw = recipe.hardware
    worker = ["--module", TRAIN_MODULE, "--run-dir", RUN_DIR]
    hostfile: list[str] | None = None
    if hw.gpu is None:
        argv = ["torchrun", "--standalone", "--nproc_per_node", "1", "-m", TRAIN_MODULE, "--run-dir", RUN_DIR]
    elif hw.nodes > 1:
        hostfile = [f"node-{i} slots={hw.gpus_per_node}" for i in range(hw.nodes)]
        argv = ["deepspeed", "--hostfile", f"{RUN_DIR}/train/hostfile", "--num_nodes", str(hw.nodes),
                "--num_gpus", str(hw.gpus_per_node), *worker]
    else:
        argv = ["deepspeed", "--num_gpus", str(hw.gpus_per_node), *worker]
    return {"command": argv, "shell": shlex.join(argv), "hostfile": hostfile, "world_size": d.world_size}
