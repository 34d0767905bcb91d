"""The frozen target sharded over the ranks with DeepSpeed ZeRO-3 (`stages.train.target_sharding: zero3`).

The resolved config partitions the target, with ZeRO++ hierarchical partitioning inside a node on
several nodes. On 2 gloo ranks (CPU) the tiny MoE target sharded captures the same hidden states
as the whole one, trains, and a killed run resumes to identical losses. Multi-GPU nodes cannot
run here: the multi-node config is checked as resolved, not run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dflashx.config.load import load_profile
from dflashx.dflash.distributed import free_port
from dflashx.dflash.trainer import run_training
from helpers_dflash import job_recipe, tiny_dataset, train_job
from helpers_moe import tiny_moe_target

# a CPU profile: one training process per "slot"
TWO_PROCESSES = {"name": "cpu-2-processes", "gpus_per_node": 2, "cpu_tflops": 0.1}
HERE = Path(__file__).resolve().parent


def _profile(nodes: int) -> dict:
    return load_profile("h200_x8").model_copy(update={"nodes": nodes}).model_dump()


@pytest.mark.parametrize(("nodes", "hpz"), [(1, 1), (2, 8)])
def test_the_resolved_config_partitions_the_target_and_keeps_gathers_in_the_node(tmp_path, nodes, hpz):
    target = tiny_moe_target(tmp_path / "t")
    train = job_recipe(target, hardware=_profile(nodes), shard_target="always", micro_batch=2).stages.train
    assert train.target_sharding == "zero3"
    config = train.target_deepspeed_config
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["zero_hpz_partition_size"] == hpz  # the GPUs of one node on several nodes
    assert config["train_micro_batch_size_per_gpu"] == train.micro_batch == 2
    assert "optimizer" not in config  # frozen: ZeRO-Inference, no optimizer states
    assert train.deepspeed_config["zero_optimization"]["stage"] == train.zero_stage < 3  # the drafter's own engine
    kept = job_recipe(target, hardware=_profile(nodes), shard_target="never").stages.train
    assert kept.target_sharding == "none" and kept.target_deepspeed_config is None


def test_an_fp8_target_is_not_sharded(tmp_path):
    from dflashx.dflash.trainer import _sharded

    job = train_job(tmp_path / "s", tmp_path / "d", tiny_moe_target(tmp_path / "t"), shard_target="always")
    job = job.model_copy(update={"target": job.target.model_copy(update={"load_precision": "fp8"})})
    with pytest.raises(ValueError, match="shard_target to never"):
        _sharded(job, None)


def _torchrun(*args: str) -> None:
    env = os.environ | {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _job(root: Path, stage: str, **kw):
    base = {"epochs": 1, "max_steps": 4, "lr": 1e-2, "global_batch": 4, "micro_batch": 1, "zero_stage": 2,
            "anchors_per_seq": 8, "checkpoint_every": 2, "log_every": 1, "hardware": TWO_PROCESSES,
            "shard_target": "always"}
    return train_job(root / stage, root / "data", root / "target", **(base | kw))


def _losses(stage_dir: Path) -> dict[int, float]:
    lines = (stage_dir / "logs" / "metrics.jsonl").read_text().splitlines()
    return {json.loads(x)["step"]: json.loads(x)["loss"] for x in lines}


@pytest.mark.slow
@pytest.mark.distributed
def test_two_ranks_sharded_capture_equals_the_whole_target(tmp_path):
    tiny_moe_target(tmp_path / "target")
    stage = tmp_path / "capture"
    stage.mkdir()
    _job(tmp_path, "capture").save()
    _torchrun(str(HERE / "shard_worker.py"), str(stage), str(tmp_path))
    for rank in (0, 1):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert r["sharded"] and 0.4 < r["held_share"] <= 0.55  # about half of every weight on each of 2 ranks
        assert max(r["diffs"]) <= 1e-5, r["diffs"]  # fp32 on CPU: the same arithmetic, gathered
        assert r["embed_equal"] and r["head_equal"]


@pytest.mark.slow
@pytest.mark.distributed
def test_two_ranks_train_on_the_sharded_target_and_resume(tmp_path):
    """Sharded 2-rank losses equal an unsharded 1-rank run's (micro batch 1, same global batch: the
    same per-sequence gradients, rel 1e-4 as in tests/test_train_distributed.py), and a run killed
    after step 2's checkpoint redoes steps 3-4 with identical losses."""
    tiny_moe_target(tmp_path / "target")
    tiny_dataset(tmp_path / "data", n=16)
    one: dict[int, float] = {}
    run_training(_job(tmp_path, "one", hardware={"name": "cpu", "cpu_tflops": 0.1}, shard_target="never"),
                 log=lambda m, s: one.__setitem__(s, m["loss"]))
    two = tmp_path / "two"
    two.mkdir()
    job = _job(tmp_path, "two")
    assert job.train.target_sharding == "zero3"
    job.save()
    trainer = ["-m", "dflashx.dflash.trainer", "--stage-dir", str(two)]
    _torchrun(*trainer)
    assert json.loads((two / "logs" / "kernels.json").read_text())["target_sharding"] == "zero3"  # it ran sharded
    losses = _losses(two)
    assert sorted(losses) == [1, 2, 3, 4]
    for step, loss in losses.items():
        assert loss == pytest.approx(one[step], rel=1e-4), step

    shutil.rmtree(two / "checkpoints" / "step-00000004")  # killed after step 2's checkpoint
    (two / "checkpoints" / "latest").write_text("step-00000002")
    _torchrun(*trainer)
    assert [json.loads(x)["step"] for x in (two / "logs" / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    resumed = _losses(two)
    for step in (3, 4):
        assert resumed[step] == pytest.approx(losses[step], rel=1e-6), step
