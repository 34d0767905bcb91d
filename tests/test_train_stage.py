"""The train stage through its contract: in-process on the CPU profile (metrics through ctx.log,
artifacts in the DFlash layout), and through the planner's launch command with two processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflashx.dflash.checkpoint import load_drafter
from dflashx.stages import train as train_stage
from helpers_dflash import tiny_dataset, tiny_target
from helpers_models import make_recipe, stage_context



H200_X8 = {"name": "h200_x8", "gpus_per_node": 8,
           "gpu": {"name": "H200", "memory_gb": 141, "bandwidth_tbs": 4.8, "bf16_tflops": 989}}
CPU_2_PROCESSES = {"name": "cpu-2-processes", "gpus_per_node": 2, "cpu_tflops": 0.1}


def _ctx(tmp_path: Path, logs: list, hardware: dict | None = None):
    target = tiny_target(tmp_path / "target")
    data = tiny_dataset(tmp_path / "data", n=8)
    recipe = make_recipe(
        target={"model": str(target), "precision": "fp32"},
        drafter={"num_layers": 1, "block_size": 4, "target_layer_ids": [1, 2]},
        stages={"train": {"max_steps": 2, "global_batch": 4, "micro_batch": 1, "anchors_per_seq": 8,
                          "lr": 1e-2, "log_every": 1, "checkpoint_every": 1, "zero_stage": 2}},
        hardware=hardware or {"name": "cpu", "cpu_tflops": 0.1},
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return stage_context("train", recipe, run_dir, inputs={"tokenize.dataset": data},
                         log=lambda m, step=None: logs.append((step, m)))


def test_launch_command_fills_the_run_dir(tmp_path):
    ctx = _ctx(tmp_path, [], H200_X8)  # an 8-GPU node: only the command is checked here
    argv, world = train_stage.launch_command(ctx)
    assert world == 8 and argv[:3] == ["deepspeed", "--num_gpus", "8"]
    assert argv[-4:] == ["--run-dir", str(ctx.run_dir), "--stage-dir", str(ctx.out_dir)]


@pytest.mark.slow
def test_stage_trains_in_process_and_exports(tmp_path):
    logs: list = []
    ctx = _ctx(tmp_path, logs)
    result = train_stage.run(ctx)
    assert set(result.artifacts) == {"checkpoint", "logs"}
    assert [s for s, _ in logs] == [1, 2] and result.metrics["step"] == 2 and result.metrics["world_size"] == 1
    drafter = load_drafter(ctx.out_dir / result.artifacts["checkpoint"].path)
    assert drafter.config.block_size == 4
    job = json.loads((ctx.out_dir / "train_job.json").read_text())
    assert job["train"]["precision"] == "fp32" and job["dataset"] == str(ctx.inputs["tokenize.dataset"])
    assert job["train"]["deepspeed_config"] == ctx.recipe.stages.train.deepspeed_config


@pytest.mark.slow
@pytest.mark.distributed
def test_stage_launches_one_process_per_rank(tmp_path):
    logs: list = []
    ctx = _ctx(tmp_path, logs, CPU_2_PROCESSES)  # the resolved launch: torchrun --nproc_per_node 2
    assert ctx.recipe.stages.train.launch_argv[:4] == ["torchrun", "--standalone", "--nproc_per_node", "2"]
    result = train_stage.run(ctx)
    assert result.metrics["world_size"] == 2 and [s for s, _ in logs] == [1, 2]
    assert (ctx.out_dir / "checkpoint" / "model.safetensors").exists()


H200_X8_TWO_NODES = H200_X8 | {"nodes": 2}


def _no_dns_for_invalid(monkeypatch):
    """Mocked name service: `.invalid` names never resolve (RFC 6761), whatever DNS this machine has."""
    import socket

    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        if str(host).endswith(".invalid"):
            raise socket.gaierror(f"unknown host {host}")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_on_two_nodes_the_stage_writes_the_hostfile_its_launch_reads(tmp_path, monkeypatch):
    """The plan's launch on a 2-node profile reads `{run_dir}/train/hostfile`; the stage writes it with the
    nodes' real addresses (`DFLASHX_NODE_HOSTS`) before it launches. The launcher (`subprocess.run` of
    `deepspeed`) is mocked: no second node exists here; the fake reads the hostfile when it is called."""
    from dflashx.backends.nodes import NODE_HOSTS_ENV

    monkeypatch.setenv(NODE_HOSTS_ENV, "127.0.0.1, 127.0.0.2")
    ctx = _ctx(tmp_path, [], H200_X8_TWO_NODES)
    launch = ctx.runtime.train_launch
    assert launch.nodes == 2 and launch.hostfile() == ("node-0 slots=8", "node-1 slots=8")
    launched = []

    def fake_run(argv, **kwargs):
        hostfile = Path(argv[argv.index("--hostfile") + 1])
        launched.append((argv, hostfile.read_text()))
        return train_stage.subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(train_stage.subprocess, "run", fake_run)
    result = train_stage.run(ctx)
    [(argv, written)] = launched
    hostfile = ctx.run_dir / "train" / "hostfile"
    assert argv[:5] == ["deepspeed", "--hostfile", str(hostfile), "--num_nodes", "2"]
    assert written == "127.0.0.1 slots=8\n127.0.0.2 slots=8\n" == hostfile.read_text()
    assert result.metrics["world_size"] == 16


def test_an_unresolvable_node_address_stops_the_stage_before_it_launches(tmp_path, monkeypatch):
    from dflashx.backends.nodes import NODE_HOSTS_ENV
    from dflashx.stages.base import StageFailed

    _no_dns_for_invalid(monkeypatch)
    monkeypatch.setenv(NODE_HOSTS_ENV, "127.0.0.1,node-b.invalid")
    ctx = _ctx(tmp_path, [], H200_X8_TWO_NODES)
    monkeypatch.setattr(train_stage.subprocess, "run", lambda *a, **k: pytest.fail("launched without a hostfile"))
    with pytest.raises(StageFailed) as stop:
        train_stage.run(ctx)
    message = str(stop.value)
    assert "training hostfile" in message and "node 1's address 'node-b.invalid' does not resolve" in message
    assert f"Set {NODE_HOSTS_ENV}=" in message and "/etc/hosts" in message
    assert not (ctx.run_dir / "train" / "hostfile").exists()
