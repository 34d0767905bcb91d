"""No compiled op at run time, on any profile (issue 38): for every built-in GPU hardware profile, the
resolved DeepSpeed config and the drafter's real parameter groups (`parameter_groups`: Muon's tags and
per-shape rates) go through the trainer's own `deepspeed.initialize` call (`dflashx.dflash.step.make_engine`)
on this CPU (gloo, one rank), with DeepSpeed's op builds (`OpBuilder.jit_load` and `.load`) made to raise
and `TORCH_CUDA_ARCH_LIST=9.0a` set as NVIDIA's Hopper images set it (DeepSpeed's `compute_capability_args`
cannot parse the `a`). Before issue 38 a GPU profile's Muon asked for DeepSpeed's compiled `fused_adam`,
whose build died on exactly that variable on a stock CUDA image.

What is not the GPU's here: the engine runs on DeepSpeed's CPU accelerator, and a profile's several GPUs
become one rank (only the batch arithmetic, `train_batch_size`, is rewritten for it); the optimizer
DeepSpeed picks depends on the config alone, not on the device, so the class and settings checked here are
the ones a GPU gets (torch's AdamW with `fused=True`: DeepSpeed passes it to AdamW, `make_engine` sets it on Muon's
AdamW half). One engine per optimizer also takes a step here (torch has a fused AdamW on CPU too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflashx.config.load import BUILTIN_PROFILES, load_profile

REPO = Path(__file__).resolve().parents[1]
GPU_PROFILES = sorted(p.stem for p in BUILTIN_PROFILES.glob("*.yaml")
                      if not p.name.endswith(".calibration.yaml") and load_profile(p.stem).gpu is not None)
PROFILES = [*GPU_PROFILES, "cpu"]  # and the CPU profile, whose AdamW is torch's default (for-loop) one

ENGINES = """
import json, sys
from pathlib import Path
from deepspeed.ops.op_builder.builder import OpBuilder

attempts = []


class BuildAttempted(Exception):  # not a RuntimeError: Muon would swallow that and fall back silently
    pass


def refuse(self, *args, **kwargs):
    attempts.append(self.name)
    raise BuildAttempted(f"DeepSpeed tried to build its {self.name} op")


OpBuilder.jit_load = refuse
OpBuilder.load = refuse

import torch
from transformers import AutoConfig
from dflashx.config.load import load_recipe
from dflashx.dflash.config import DFlashConfig
from dflashx.dflash.distributed import setup_distributed
from dflashx.dflash.model import DFlashDrafter
from dflashx.dflash.step import LM_HEAD_CHUNK, TrainModule, make_engine
from dflashx.plan.plan import make_plan
from dflashx.targets.facts import facts_for
from dflashx.targets.locate import locate_target

setup_distributed()
repo, profiles = Path(sys.argv[1]), sys.argv[2].split(",")
seen = {}
for name in profiles:
    for optimizer, precision in [(o, p) for o in ("muon", "adamw") for p in ("fp32", "bf16")]:
        overrides = [f"hardware={name}", f"train.optimizer={optimizer}", f"target.precision={precision}"]
        recipe = load_recipe(repo / "recipes" / "tiny.yaml", overrides).recipe
        resolved = make_plan(recipe, facts_for(recipe.target)).resolved
        train = resolved.stages.train
        one_rank = train.deepspeed_config | {"train_batch_size": train.micro_batch * train.grad_accum}
        train = train.model_copy(update={"deepspeed_config": one_rank, "world_size": 1})
        target_config = AutoConfig.from_pretrained(locate_target(recipe.target))
        drafter = DFlashDrafter(DFlashConfig.from_target(resolved.drafter, target_config))
        module = TrainModule(drafter, LM_HEAD_CHUNK, "torch", train.loss, train.dpace_alpha)
        engine = make_engine(train, module, drafter, total_steps=10)
        basic = engine.basic_optimizer
        adam = getattr(basic, "aux_optimizer", basic)
        stepped = None
        if name == profiles[0] and precision == "fp32":  # one step: the fused half runs (Muon uncompiled)
            engine.backward(sum((p.float() ** 2).sum() for p in drafter.parameters() if p.requires_grad))
            with torch._dynamo.config.patch(disable=True):
                engine.step()
            stepped = sorted({str(s["step"].device) for s in adam.state.values() if "step" in s})
        seen[f"{name}/{optimizer}/{precision}"] = {
            "bf16": train.deepspeed_config["bf16"]["enabled"], "basic": type(basic).__name__,
            "adam": type(adam).__module__ + "." + type(adam).__name__, "stepped": stepped,
            "fused": [g.get("fused") for g in adam.param_groups], "foreach": adam.defaults.get("foreach")}
print(json.dumps({"attempts": attempts, "seen": seen}))
"""


@pytest.mark.slow
def test_every_gpu_profiles_optimizer_builds_with_no_compiled_op(tmp_path):
    assert {"h200_x1", "h100_x8", "b200_nvl8", "rtx_pro_6000_x4"} <= set(GPU_PROFILES)
    env = os.environ | {"PYTHONPATH": str(REPO), "TORCH_CUDA_ARCH_LIST": "9.0a", "DS_ACCELERATOR": "cpu",
                        "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", ENGINES, str(REPO), ",".join(PROFILES)], capture_output=True,
                          text=True, env=env, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["attempts"] == []
    assert not (tmp_path / "ext").exists()  # nothing written where torch builds extensions
    assert sorted(out["seen"]) == sorted(f"{p}/{o}/{t}" for p in PROFILES for o in ("muon", "adamw")
                                         for t in ("fp32", "bf16"))
    for key, seen in out["seen"].items():
        name, optimizer, precision = key.split("/")
        gpu = name != "cpu"
        assert seen["bf16"] is (gpu and precision == "bf16"), key  # as resolved: bf16 on GPUs for a bf16 target
        assert seen["adam"] == "torch.optim.adamw.AdamW", key
        assert seen["basic"] == ("AdamW" if optimizer == "adamw" else "MuonWithAuxAdam"), key
        assert seen["fused"] and set(seen["fused"]) == {True if gpu else None}, key  # on GPUs torch's fused kernel
        assert seen["foreach"] is None, key  # the CPU profile: torch's default (for-loop on CPU)
    stepped = {k: v["stepped"] for k, v in out["seen"].items() if v["stepped"] is not None}
    assert stepped == {f"{GPU_PROFILES[0]}/{o}/fp32": ["cpu"] for o in ("muon", "adamw")}
