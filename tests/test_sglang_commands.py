"""Every server command the plan emits parses with SGLang's own argument parser (the `sglang` extra
pins the version the flags were checked against); skipped where SGLang is not installed."""

from __future__ import annotations

import argparse

import pytest
from _plan_recipes import seeds_recipe

from dflashx.plan.plan import make_plan

server_args = pytest.importorskip("sglang.srt.server_args")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize("recipe", [
    seeds_recipe("rtx_pro_6000_x4"),
    seeds_recipe("b200_nvl8", target__mtp=True),
    seeds_recipe("b200_nvl8", stages__generate__serving={"weight_dtype": "fp8", "kv_cache_dtype": "fp8_e4m3"}),
    seeds_recipe("h200_x8", stages__generate__serving={"weight_dtype": "fp8", "checkpoint": "Qwen/Qwen3.6-27B-FP8"}),
    seeds_recipe("h200_x8", hardware__nodes=2),
])
def test_every_emitted_server_command_parses(recipe):
    servers = next(s for s in make_plan(recipe).to_json()["stages"] if s["name"] == "generate")["servers"]
    assert servers
    for server in servers:
        argv = server["command"]
        assert argv[:3] == ["python", "-m", "sglang.launch_server"]
        args = parse(argv[3:])
        assert args.model_path and args.tp_size >= 1 and args.max_running_requests >= 1


def test_the_old_mamba_flag_is_rejected():
    with pytest.raises(SystemExit):
        parse(["--model-path", "m", "--mamba-scheduler-strategy", "extra_buffer"])
    assert parse(["--model-path", "m", "--mamba-radix-cache-strategy", "extra_buffer"])
