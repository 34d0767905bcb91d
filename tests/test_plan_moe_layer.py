"""The MoE layer's cost (`dflashx.plan.estimates.moe`, issue 29): constants from the machine's measurements,
its regimes, the one function every path uses, and the trainer's experts implementation."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest

from benchmarks.moe_constants import RESULT, derive
from dflashx.plan.estimates import moe
from dflashx.plan.estimates.device import Device
from dflashx.targets.registry import REGISTRY, lookup

H200 = Device("NVIDIA H200", 141e9, 4.8e12, 989e12, 1979e12, 1)
MOE_TARGETS = [f for f in REGISTRY.values() if f.is_moe]


def test_constants_are_the_measurements_reduced():
    derived = derive(json.loads(RESULT.read_text()))
    assert moe.GROUPED_READ.value == pytest.approx(derived["read_share"], abs=5e-4)
    assert moe.GROUPED_FIXED.value == pytest.approx(derived["fixed_s"], abs=5e-8)
    assert dict(moe.EFFICIENCY) == pytest.approx(derived["efficiency"], abs=5e-4)
    assert moe.GRAPH_FLOOR.value == pytest.approx(derived["graph_floor_s"], abs=5e-9)
    assert moe.EAGER_FLOOR.value == pytest.approx(derived["eager_floor_s"], abs=5e-9)
    assert moe.TRANSFORMERS_ROW_BYTES.value == pytest.approx(derived["transformers_row_bytes_per_hidden"], abs=0.05)


@pytest.mark.parametrize("facts", MOE_TARGETS, ids=lambda f: f.name)
@pytest.mark.parametrize("path", [moe.SGLANG_DECODE, moe.SGLANG_PREFILL, moe.TRANSFORMERS_TRAIN], ids=lambda p: p.name)
def test_monotone_in_tokens(facts, path):
    times = [moe.moe_layer(facts, 2**p, "bf16", H200, path).seconds for p in range(15)]
    assert all(b >= a for a, b in itertools.pairwise(times))


def test_regimes_memory_compute_and_floors():
    facts = lookup("Qwen/Qwen3-30B-A3B")
    one = moe.moe_layer(facts, 1, "bf16", H200, moe.SGLANG_DECODE)
    assert one.bound == "memory" and one.touched == pytest.approx(8) and one.rows_per_expert == pytest.approx(1)
    assert one.fixed_s + one.floor_s > one.memory_s  # a decode token pays the kernels more than its weights
    big = moe.moe_layer(facts, 16384, "bf16", H200, moe.SGLANG_PREFILL)
    assert big.bound == "compute" and big.rows_per_expert == pytest.approx(1024, rel=1e-3)
    assert big.efficiency == pytest.approx(dict(moe.EFFICIENCY)[1024])
    # below 64 rows the efficiency is held and memory binds; between points it interpolates in log rows
    assert moe.efficiency(4) == moe.efficiency(64) and 0.406 < moe.efficiency(181) < 0.657
    eager = moe.moe_layer(facts, 1, "bf16", H200, moe.SGLANG_PREFILL)
    assert eager.floor_s > one.floor_s == pytest.approx(5 * moe.GRAPH_FLOOR.value)
    fp8 = moe.moe_layer(facts, 16384, "fp8", H200, moe.SGLANG_PREFILL)
    assert fp8.compute_s < big.compute_s and fp8.kernels == big.kernels + 2
    shared = lookup("Qwen/Qwen3.6-35B-A3B")
    assert moe.moe_layer(shared, 1, "bf16", H200, moe.SGLANG_DECODE).kernels == 7
    # no GPU: the plain roofline, no fixed cost or floor
    cpu = moe.moe_layer(facts, 1, "bf16", replace(H200, memory_bytes=None), moe.ROOFLINE)
    assert cpu.fixed_s == cpu.floor_s == cpu.movement_s == 0.0 and cpu.efficiency == 1.0


def test_tp_splits_the_experts_not_the_rows():
    facts = lookup("Qwen/Qwen3-235B-A22B")
    one, two = (moe.moe_layer(facts, 4096, "bf16", H200, moe.SGLANG_PREFILL, tp) for tp in (1, 2))
    assert two.rows_per_expert == one.rows_per_expert and two.flops == pytest.approx(one.flops / 2)


def test_every_moe_row_runs_through_the_one_function(monkeypatch):
    """Raising the measured fixed cost moves every MoE row of planner_accuracy (serving, TTFT, MTP, the trainer)
    and no dense row: no second formula for the routed experts."""
    from benchmarks import planner_accuracy as pa

    before = {r.reference: r.predicted for r in pa.moe_rows() + pa.moe_training_rows() + pa.serving_rows()}
    monkeypatch.setattr(moe, "GROUPED_FIXED", replace(moe.GROUPED_FIXED, value=1e-3))
    after = {r.reference: r.predicted for r in pa.moe_rows() + pa.moe_training_rows() + pa.serving_rows()}
    for name, value in before.items():
        if "35B-A3B" in name or "a3b-moe" in name:
            assert after[name] != pytest.approx(value, rel=1e-3), name
        else:
            assert after[name] == value, name


def test_trainer_plans_moe_layers_and_keeps_active_mfu():
    """The trainer's MoE step: routed experts from moe.trainer_moe, the rest at the dense MFU."""
    from dflashx.plan.estimates.moe import trainer_moe

    facts = lookup("Qwen/Qwen3-30B-A3B")
    t = trainer_moe(facts, 45, [3072.0], 1, "bf16", H200)
    assert t.layers == 46 and t.layer is not None and t.layer.path == moe.TRANSFORMERS_TRAIN.name
    assert t.routed_flops == pytest.approx(2 * 46 * 8 * facts.expert_params * 3072)
    assert t.seconds == pytest.approx(46 * moe.moe_layer(facts, 3072, "bf16", H200, moe.TRANSFORMERS_TRAIN).seconds)
    assert trainer_moe(lookup("Qwen/Qwen3-8B"), 30, [3072.0], 1, "bf16", H200).seconds == 0.0


def test_trainer_loads_moe_experts_on_grouped_mm():
    torch = pytest.importorskip("torch")
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from dflashx.targets.load import EXPERTS_IMPLEMENTATION, fastest_experts

    assert EXPERTS_IMPLEMENTATION == "grouped_mm"
    small = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
             "num_key_value_heads": 1, "vocab_size": 64}
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**small, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2))
    model.config._experts_implementation = "eager"
    assert fastest_experts(model).config._experts_implementation == "grouped_mm"
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 64)
    dense = Qwen3ForCausalLM(Qwen3Config(**small))
    assert fastest_experts(dense) is dense
