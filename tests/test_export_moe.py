"""Export for mixture-of-experts targets: the drafter stays dense, the export records the target's
family (DFlash `dflash_config.target_model_type` / `target_architectures`; speculators'
verifier architectures and `target_model_type`), both engine checkers accept it, a drafter
recorded for another family is refused, and the serve commands carry the family's reasoning
parser and, over several GPUs, tensor plus expert parallelism."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from dflashx.config.load import load_recipe
from dflashx.config.schema import Recipe
from dflashx.dflash.checkpoint import save_drafter, weight_shapes
from dflashx.dflash.config import DFlashConfig
from dflashx.dflash.model import DFlashDrafter
from dflashx.export import Serving, check_sglang, check_speculators, from_speculators, to_speculators
from dflashx.export.serve import sglang_argv, vllm_argv
from dflashx.resolve import resolve
from dflashx.targets.facts import facts_for
from helpers_dflash import job_recipe, load_target
from helpers_moe import FAMILIES, tiny_moe_target

REPO = Path(__file__).resolve().parents[1]
ARCH = {"qwen3_moe": "Qwen3MoeForCausalLM", "qwen3_5_moe": "Qwen3_5MoeForCausalLM", "gpt_oss": "GptOssForCausalLM"}


@pytest.fixture(scope="module", params=FAMILIES)
def exported(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    folder = tiny_moe_target(root / "target", request.param)
    model, _ = load_target(folder)
    resolved = job_recipe(folder)
    drafter = DFlashDrafter(DFlashConfig.from_target(resolved.drafter, model.config))
    save_drafter(drafter, root / "drafter")
    config = DFlashConfig.from_target(resolved.drafter, model.config).to_hf_dict()
    return request.param, resolved.target.facts, config, weight_shapes(root / "drafter")


def test_the_export_of_an_moe_drafter_is_dense_and_names_the_target_family(exported):
    family, facts, config, shapes = exported
    assert facts.is_moe and config["dflash_config"]["target_model_type"] == facts.model_type
    assert config["dflash_config"]["target_architectures"] == [ARCH[family]]
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert not any("expert" in name or "router" in name or ".gate.weight" in name for name in shapes)
    assert check_sglang(config, facts, shapes) == []
    spec = to_speculators(config, verifier="/models/target")
    assert spec["speculators_config"]["verifier"]["architectures"] == [ARCH[family]]
    assert spec["target_model_type"] == facts.model_type
    assert check_speculators(spec, facts, shapes) == []
    back = from_speculators(spec, facts.num_layers)["dflash_config"]  # the record survives the round trip
    assert (back["target_model_type"], back["target_architectures"]) == (facts.model_type, [ARCH[family]])


def test_a_drafter_of_another_family_is_refused(exported):
    _, facts, config, shapes = exported
    other = facts.model_copy(update={"model_type": "llama"})
    (v,) = check_sglang(config, other, shapes)
    assert v.key == "dflash_config.target_model_type" and facts.model_type in v.message
    unrecorded = copy.deepcopy(config)
    del unrecorded["dflash_config"]["target_model_type"]  # public checkpoints carry no record: accepted
    assert check_sglang(unrecorded, other, shapes) == []


def _resolved(model: str, hardware: str):
    data = copy.deepcopy(load_recipe(REPO / "recipes" / "qwen36_27b.yaml", [f"hardware={hardware}"]).data)
    data["target"] = {**data["target"], "model": model, "mtp": False}
    recipe = Recipe.model_validate(data)
    return resolve(recipe, facts_for(recipe.target))


@pytest.mark.parametrize(("model", "sglang_parser", "vllm_parser", "planned_tp"), [
    ("Qwen/Qwen3-235B-A22B", "qwen3", "qwen3", 4),  # 470 GB of bf16 weights: over several H200s
    ("openai/gpt-oss-120b", "gpt-oss", "openai_gptoss", 1),  # MXFP4 experts: one H200
])
def test_serve_commands_carry_the_moe_targets_flags(exported, model, sglang_parser, vllm_parser, planned_tp):
    _, _, config, _ = exported
    resolved = _resolved(model, "h200_x8")
    facts, tp = resolved.target.facts, resolved.stages.generate.serving.tp
    assert tp == planned_tp
    s = Serving.of(config, facts, model, "/r/export/drafter", "/r/export/drafter-vllm", tp=tp)
    sglang, vllm = sglang_argv(s), vllm_argv(s)
    assert sglang[sglang.index("--reasoning-parser") + 1] == sglang_parser
    assert vllm[vllm.index("--reasoning-parser") + 1] == vllm_parser
    if tp > 1:  # the plan's layout: experts spread over the same GPUs
        assert sglang[sglang.index("--tp-size") + 1] == sglang[sglang.index("--ep-size") + 1] == str(tp)
        assert vllm[vllm.index("--tensor-parallel-size") + 1] == str(tp) and "--enable-expert-parallel" in vllm
    one = Serving.of(config, facts, model, "/d", "/v", tp=1)
    assert not {"--tp-size", "--ep-size"} & set(sglang_argv(one))
    assert not {"--tensor-parallel-size", "--enable-expert-parallel"} & set(vllm_argv(one))


def test_a_dense_target_over_several_gpus_gets_no_expert_parallelism(exported):
    _, facts, config, _ = exported
    dense = facts.model_copy(update={"num_experts": 0, "num_experts_per_tok": 0})
    s = Serving.of(config, dense, "t", "/d", "/v", tp=4)
    assert "--tp-size" in sglang_argv(s) and "--ep-size" not in sglang_argv(s)
    assert "--enable-expert-parallel" not in vllm_argv(s)
