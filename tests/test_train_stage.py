"""The train stage through its contract: in-process on the CPU profile (metrics through ctx.log,
artifacts in the DFlash layout), and through the planner's launch command with two processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflashx.dflash.checkpoint import load_drafter
from dflashx.dflash.distributed import free_port
from dflashx.stages import train as train_stage
from helpers_dflash import tiny_dataset, tiny_target
from helpers_models import make_recipe, stage_context

pytest.importorskip("dflashx.targets.resolve", reason="target resolver (dflashx.targets.resolve) not present yet")


def _ctx(tmp_path: Path, plan: dict, logs: list):
    target = tiny_target(tmp_path / "target")
    data = tiny_dataset(tmp_path / "data", n=8)
    recipe = make_recipe(
        target={"model": str(target), "precision": "fp32"},
        drafter={"num_layers": 1, "block_size": 4, "target_layer_ids": [1, 2]},
        stages={"train": {"max_steps": 2, "global_batch": 4, "micro_batch": 1, "anchors_per_seq": 8,
                          "lr": 1e-2, "log_every": 1, "checkpoint_every": 1}},
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return stage_context("train", recipe, run_dir, inputs={"tokenize.dataset": data}, plan=plan,
                         log=lambda m, step=None: logs.append((step, m)))


def test_launch_command_fills_the_run_dir(tmp_path):
    ctx = _ctx(tmp_path, {"launch": {"command": ["deepspeed", "--num_gpus", "8", "--module", "dflashx.stages.train",
                                                 "--run-dir", "{run_dir}"], "world_size": 8}}, [])
    argv, world = train_stage.launch_command(ctx)
    assert world == 8 and argv[-4:] == ["--run-dir", str(ctx.run_dir), "--stage-dir", str(ctx.out_dir)]


@pytest.mark.slow
def test_stage_trains_in_process_and_exports(tmp_path):
    logs: list = []
    ctx = _ctx(tmp_path, {"deepspeed_config": {"zero_optimization": {"stage": 2}}}, logs)
    result = train_stage.run(ctx)
    assert set(result.artifacts) == {"checkpoint", "logs"}
    assert [s for s, _ in logs] == [1, 2] and result.metrics["step"] == 2 and result.metrics["world_size"] == 1
    drafter = load_drafter(ctx.out_dir / result.artifacts["checkpoint"].path)
    assert drafter.config.block_size == 4
    job = json.loads((ctx.out_dir / "train_job.json").read_text())
    assert job["precision"] == "fp32" and job["dataset"] == str(ctx.inputs["tokenize.dataset"])


@pytest.mark.slow
@pytest.mark.distributed
def test_stage_launches_one_process_per_rank(tmp_path):
    import sys

    logs: list = []
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
            "-m", "dflashx.stages.train", "--run-dir", "{run_dir}"]
    ctx = _ctx(tmp_path, {"launch": {"command": argv, "world_size": 2}}, logs)
    result = train_stage.run(ctx)
    assert result.metrics["world_size"] == 2 and [s for s, _ in logs] == [1, 2]
    assert (ctx.out_dir / "checkpoint" / "model.safetensors").exists()
