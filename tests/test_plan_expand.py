"""Stage expansion: SGLang server command lines, the DeepSpeed config (checked by DeepSpeed itself)
and the launch command."""

from __future__ import annotations

import pytest
from _plan_recipes import seeds_recipe, tiny_recipe

from dflashx.plan.plan import make_plan


def stage(recipe, name: str) -> dict:
    return next(s for s in make_plan(recipe).to_json()["stages"] if s["name"] == name)


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_rtx_one_server_per_gpu_behind_the_router():
    gen = stage(seeds_recipe("rtx_pro_6000_x4"), "generate")
    servers = gen["servers"]
    assert [s["gpus"] for s in servers] == [[0], [1], [2], [3]]
    assert len({s["port"] for s in servers}) == 4
    for s in servers:
        argv = s["command"]
        assert argv[:3] == ["python", "-m", "sglang.launch_server"]
        assert flag(argv, "--model-path") == "Qwen/Qwen3.6-27B" and flag(argv, "--tp-size") == "1"
        assert flag(argv, "--port") == str(s["port"]) and s["url"].endswith(f":{s['port']}")
        assert flag(argv, "--context-length") == "262144" and flag(argv, "--mem-fraction-static") == "0.85"
        assert int(flag(argv, "--max-running-requests")) == 256 and s["in_flight"] == gen["in_flight_per_replica"] > 0
        assert flag(argv, "--reasoning-parser") == "qwen3" and "--enable-hierarchical-cache" in argv
        assert "--dp-size" not in argv and "--quantization" not in argv and "--kv-cache-dtype" not in argv
    router = gen["router"]["command"]
    assert router[:3] == ["python", "-m", "sglang_router.launch_router"]
    assert router[router.index("--worker-urls") + 1:] == [s["url"] for s in servers]
    assert len(gen["commands"]) == 5 and gen["commands"][0].startswith("CUDA_VISIBLE_DEVICES=0 ")


def test_b200_one_server_with_dp_size_keeps_the_planned_batch_per_gpu_in_flight():
    gen = stage(seeds_recipe("b200_nvl8"), "generate")
    (server,) = gen["servers"]
    argv = server["command"]
    assert flag(argv, "--dp-size") == "8" and flag(argv, "--tp-size") == "1"
    assert "--quantization" not in argv and "--kv-cache-dtype" not in argv  # the target's precision by default
    assert server["gpus"] == list(range(8)) and gen["router"] is None
    assert server["in_flight"] == 8 * gen["in_flight_per_replica"]  # one URL, eight replicas behind it


def test_fp8_from_the_official_checkpoint_loads_it_and_online_fp8_quantizes():
    official = {"weight_dtype": "fp8", "checkpoint": "Qwen/Qwen3.6-27B-FP8", "kv_cache_dtype": "fp8_e4m3"}
    argv = stage(seeds_recipe("b200_nvl8", stages__generate__serving=official), "generate")["servers"][0]["command"]
    assert flag(argv, "--model-path") == "Qwen/Qwen3.6-27B-FP8" and "--quantization" not in argv
    assert flag(argv, "--kv-cache-dtype") == "fp8_e4m3"
    online = seeds_recipe("b200_nvl8", stages__generate__serving={"weight_dtype": "fp8"})
    plan = make_plan(online).to_json()
    argv = next(s for s in plan["stages"] if s["name"] == "generate")["servers"][0]["command"]
    assert flag(argv, "--model-path") == "Qwen/Qwen3.6-27B" and flag(argv, "--quantization") == "fp8"
    found = next(w for w in plan["warnings"] if w["code"] == "fp8_online_quantization")
    assert found["key"] == "stages.generate.serving.checkpoint" and "Qwen/Qwen3.6-27B-FP8" in found["fix"]


def test_mtp_flags_follow_the_recipe_and_the_target():
    argv = stage(seeds_recipe("b200_nvl8", target__mtp=True), "generate")["servers"][0]["command"]
    assert flag(argv, "--speculative-algorithm") == "EAGLE" and flag(argv, "--speculative-num-steps") == "3"
    assert flag(argv, "--speculative-eagle-topk") == "1" and flag(argv, "--speculative-num-draft-tokens") == "4"
    five = seeds_recipe("b200_nvl8", target__mtp=True, stages__generate__serving={"speculative": {
        "algorithm": "NEXTN", "num_steps": 5, "num_draft_tokens": 6}})
    argv = stage(five, "generate")["servers"][0]["command"]
    assert flag(argv, "--speculative-algorithm") == "NEXTN" and flag(argv, "--speculative-num-steps") == "5"
    assert flag(argv, "--speculative-num-draft-tokens") == "6"
    plain = stage(seeds_recipe("b200_nvl8", target__mtp=False), "generate")["servers"][0]["command"]
    assert "--speculative-algorithm" not in plain


def test_thinking_off_drops_the_reasoning_parser_and_hicache_switch():
    r = seeds_recipe("b200_nvl8", target__chat_template__enable_thinking=False,
                     stages__generate__hierarchical_cache=False)
    argv = stage(r, "generate")["servers"][0]["command"]
    assert "--reasoning-parser" not in argv and "--enable-hierarchical-cache" not in argv


@pytest.mark.parametrize("overrides", [
    {"stages__generate__urls": ["http://10.0.0.5:30000"]},
    {"stages__generate__backend": "transformers"},
])
def test_nothing_launched_when_attached_or_local(overrides):
    gen = stage(seeds_recipe("b200_nvl8", **overrides), "generate")
    assert not any(s["command"] for s in gen["servers"]) and gen["commands"] == []
    assert gen["mode"] == ("attach" if "stages__generate__urls" in overrides else "in-process")


def deepspeed_accepts(config: dict) -> None:
    """DeepSpeed's own config parser (single process: world size 1) checks the batch arithmetic."""
    from deepspeed.runtime.config import DeepSpeedConfig

    parsed = DeepSpeedConfig(config)
    assert parsed.train_batch_size == config["train_batch_size"]
    assert parsed.zero_optimization_stage == config["zero_optimization"]["stage"]


def test_deepspeed_config_single_gpu_is_valid():
    train = stage(seeds_recipe("h200_x1"), "train")
    cfg = train["deepspeed_config"]
    assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (
        64, 1, 64)
    # the seeds' recipe trains with Muon: DeepSpeed's built-in, no clipping (ZeRO 1/2 would clip the
    # orthogonalised update), the AdamW half at the recipe's lr
    assert cfg["bf16"]["enabled"] and cfg["gradient_clipping"] == 0.0
    assert cfg["optimizer"]["type"] == "Muon" and cfg["optimizer"]["params"]["lr"] == 6e-4
    assert cfg["optimizer"]["params"]["momentum"] == 0.95
    assert "scheduler" not in cfg  # built by the trainer from the measured step count
    deepspeed_accepts(cfg)
    assert train["launch"]["command"][:3] == ["deepspeed", "--num_gpus", "1"]
    adamw = stage(seeds_recipe("h200_x1", stages__train__optimizer="adamw"), "train")["deepspeed_config"]
    assert adamw["optimizer"]["type"] == "AdamW" and adamw["gradient_clipping"] == 1.0
    deepspeed_accepts(adamw)


def test_deepspeed_config_cpu_is_fp32_and_valid():
    train = stage(tiny_recipe(), "train")
    cfg = train["deepspeed_config"]
    assert cfg["bf16"]["enabled"] is False and cfg["gradient_accumulation_steps"] == 4  # 8 / (2 x 1)
    deepspeed_accepts(cfg)
    assert train["launch"]["command"][0] == "torchrun" and train["launch"]["hostfile"] is None


def test_deepspeed_rejects_what_the_batch_rule_rejects():
    r = seeds_recipe("h200_x1", stages__train__micro_batch=3)
    plan = make_plan(r).to_json()
    assert any(e["code"] == "global_batch" for e in plan["errors"])
    cfg = next(s for s in plan["stages"] if s["name"] == "train")["deepspeed_config"]
    assert cfg["train_batch_size"] == 3 * 22 != r.stages.train.global_batch  # what it would run: not the recipe's


def test_several_nodes_get_a_hostfile():
    train = stage(seeds_recipe("h200_x8", hardware__nodes=2), "train")
    launch = train["launch"]
    assert launch["hostfile"] == ["node-0 slots=8", "node-1 slots=8"] and launch["world_size"] == 16
    assert flag(launch["command"], "--num_nodes") == "2" and "--hostfile" in launch["command"]
    assert train["deepspeed_config"]["gradient_accumulation_steps"] == 4  # 64 / (1 x 16)


@pytest.mark.parametrize(("dp_mode", "servers_per_node"), [("router", 8), ("dp_size", 1)])
def test_two_nodes_put_servers_on_each_node(dp_mode, servers_per_node):
    r = seeds_recipe("h200_x8", hardware__nodes=2, stages__generate__serving={"dp_mode": dp_mode})
    plan = make_plan(r).to_json()
    servers = next(s for s in plan["stages"] if s["name"] == "generate")["servers"]
    assert [s["node"] for s in servers] == [0] * servers_per_node + [1] * servers_per_node
    assert all(max(s["gpus"]) < 8 for s in servers)  # local GPU indices on each node
    remote = [s for s in servers if s["node"] == 1]
    assert all(s["url"].startswith("http://node-1:") and flag(s["command"], "--host") == "0.0.0.0" for s in remote)
    if dp_mode == "dp_size":
        assert [flag(s["command"], "--dp-size") for s in servers] == ["8", "8"]
    assert any(f["code"] == "servers_on_other_nodes" for f in plan["warnings"])
