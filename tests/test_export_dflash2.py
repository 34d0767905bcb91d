"""The DFlash2 export contract (`export.dflash2`, through `check_sglang`) and its serve commands, on
hand-written DFlash2 configs: the Qwen3.6-27B seeds' exported DFlash config made DFlash2 as issue #28's
checkpoints are (architectures, the four `dflash_config` keys, `is_causal: false`), and the weight
shapes of the published layout (codebooks without `.weight`)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from test_export_contracts import _exported, _resolved, _shapes

from dflashx.export import Serving, check_sglang, readme
from dflashx.export.dflash2 import expected_shapes
from dflashx.export.serve import sglang_argv, vllm_argv

D2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}


@pytest.fixture(scope="module")
def seeds():
    return _resolved("qwen36_27b.yaml", architecture="dflash", num_layers=2, block_size=8, sliding_window=2048,
                     layer_types=["sliding_attention", "sliding_attention"])


def dflash2_config(seeds) -> dict[str, Any]:
    config = copy.deepcopy(_exported(seeds))
    config["architectures"] = ["DFlash2DraftModel"]
    config["dflash_config"] |= D2 | {"causal_layers": [False, False]}
    config["is_causal"] = False
    return config


def shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    plain = {**config, "architectures": ["DFlashDraftModel"], "dflash_config": {
        k: v for k, v in config["dflash_config"].items() if k not in D2}}
    f = 5120, 248_320
    return _shapes(plain) | expected_shapes(config, *f)


def keys(violations) -> list[str]:
    return [v.key for v in violations]


def test_a_published_style_dflash2_export_meets_the_contract(seeds):
    config = dflash2_config(seeds)
    facts = seeds.target.facts
    assert check_sglang(config, facts, shapes(config)) == []
    assert shapes(config)["candidate_selector.predecessor_codebook"] == (248_320, 256)
    assert shapes(config)["layers.1.mlp_conv.kernel_projection.weight"] == (2 * 2 * 5120 // 16, 5120)


@pytest.mark.parametrize(("edit", "key"), [
    (lambda c: c["dflash_config"].pop("selector_rank"), "dflash_config.selector_rank"),
    (lambda c: c["dflash_config"].update(conv_group_size=48), "dflash_config.conv_group_size"),
    (lambda c: c["dflash_config"].update(selector_top_k=300_000), "dflash_config.selector_top_k"),
    (lambda c: c["dflash_config"].update(conv_kernel_size="2"), "dflash_config.conv_kernel_size"),
    (lambda c: c.pop("is_causal"), "is_causal"),
    (lambda c: c.update(architectures=["DFlashDraftModel"]), "architectures"),
])
def test_each_broken_dflash2_rule_names_its_key(seeds, edit, key):
    config = dflash2_config(seeds)
    edit(config)
    assert key in keys(check_sglang(config, seeds.target.facts))


def test_dflash2_weights_missing_or_misshapen(seeds):
    config, facts = dflash2_config(seeds), seeds.target.facts
    without = {k: v for k, v in shapes(config).items() if "codebook" not in k}
    found = check_sglang(config, facts, without)
    assert keys(found) == ["model.safetensors"] and "predecessor_codebook" in found[0].message
    with_weight = {(k + ".weight" if "codebook" in k else k): v for k, v in shapes(config).items()}
    assert keys(check_sglang(config, facts, with_weight)) == ["model.safetensors"]  # `.weight` is not the layout
    wrong = shapes(config) | {"layers.0.attention_conv.base_kernel": (2, 3, 5120)}
    assert "base_kernel" in check_sglang(config, facts, wrong)[0].message


def test_dflash2_serve_commands(seeds):
    config = dflash2_config(seeds)
    s = Serving.of(config, seeds.target.facts, "Qwen/Qwen3.6-27B", "/r/export/drafter", "/r/export/drafter-vllm")
    assert s.dflash2
    argv = sglang_argv(s)
    assert argv[argv.index("--speculative-algorithm") + 1] == "DFLASH"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "8"
    vllm = vllm_argv(s)
    spec = json.loads(vllm[vllm.index("--speculative-config") + 1])
    # vLLM takes the convolution's block from num_speculative_tokens + 1 and reads dflash_config itself
    assert spec == {"method": "dflash", "model": "/r/export/drafter", "num_speculative_tokens": 7}
    assert "PR 52816" in readme(s, config, "qwen36", "bf16")
    plain = Serving.of(_exported(seeds), seeds.target.facts, "Qwen/Qwen3.6-27B", "/r/d", "/r/v")
    assert not plain.dflash2 and json.loads(vllm_argv(plain)[vllm_argv(plain).index("--speculative-config") + 1])[
        "model"] == "/r/v"
