"""The training estimate: MFU from the cited table (no profile knob), the drafter's gradient sync over
the interconnect, the ZeRO stage / micro batch rules."""

from __future__ import annotations

import json

import pytest
import yaml
from _plan_recipes import REPO, profile, seeds_recipe, tiny_recipe

from dflashx.config.schema import HardwareProfile
from dflashx.plan.context import build_context
from dflashx.plan.estimates.gradsync import grad_sync
from dflashx.plan.estimates.mfu import H200_DATASHEET_TFLOPS, MEASURED, mfu_row
from dflashx.resolve import resolve
from dflashx.targets.registry import lookup

QWEN36, QWEN3_32B = lookup("Qwen/Qwen3.6-27B"), lookup("Qwen/Qwen3-32B")


def hw(name: str, **changes) -> HardwareProfile:
    return HardwareProfile.model_validate({**profile(name), **changes})


def test_no_hardware_profile_holds_an_mfu_or_training_knob():
    for path in (REPO / "dflashx" / "hardware_profiles").glob("*.yaml"):
        text = path.read_text()
        data = yaml.safe_load(text)
        assert "training" not in data and "mfu" not in text.lower(), path.name


def test_hopper_rows_are_the_h200_benchmark_over_the_datasheet_peak():
    """Each measured H200 row is the useful TFLOP/s benchmarks/results/train_step.json recorded, divided
    by the datasheet peak the planner and the trainer divide by (not the benchmark's own matmul peak)."""
    bench = json.loads((REPO / "benchmarks/results/train_step.json").read_text())
    variants = {"bf16": "trainer", "fp8": "trainer, fp8 drafter + target"}
    shapes = {"dense": "qwen3-32b-dense", "hybrid": "qwen3.6-27b-hybrid"}
    results = [r for call in bench["calls"] for r in call["results"]]
    for (gen, precision, kind), row in MEASURED.items():
        if gen != "hopper":
            continue
        result = next(r for r in results if r["shape"] == shapes[kind])
        measured = next(v for v in result["rows"] if v["variant"] == variants[precision])
        assert row.mfu == pytest.approx(measured["useful_tflops"] / H200_DATASHEET_TFLOPS, abs=2e-4)
        assert row.mfu < measured["mfu"]  # the datasheet peak is above the measured matmul peak
    assert hw("h200_x8").gpu.bf16_tflops == hw("h200_x1").gpu.bf16_tflops == H200_DATASHEET_TFLOPS == 989


def test_rows_by_generation_precision_and_kind_say_when_they_are_borrowed():
    h200 = mfu_row(hw("h200_x8"), "bf16", hybrid=True)
    assert h200 == MEASURED[("hopper", "bf16", "hybrid")] and not h200.borrowed
    assert mfu_row(hw("h200_x8"), "bf16", hybrid=False).mfu > h200.mfu  # the dense step is faster
    b200 = mfu_row(hw("b200_nvl8"), "fp8", hybrid=False)
    assert b200.generation == "blackwell" and b200.mfu == MEASURED[("hopper", "fp8", "dense")].mfu
    assert "no Blackwell measurement" in b200.borrowed
    rtx = mfu_row(hw("rtx_pro_6000_x4"), "bf16", hybrid=True)
    assert rtx.generation == "blackwell" and "Hopper" in rtx.borrowed
    odd = mfu_row(hw("h200_x8", gpu=hw("h200_x8").gpu.model_dump() | {"name": "MI300X"}), "bf16", hybrid=False)
    assert "matches no known generation" in odd.borrowed
    cpu = mfu_row(hw("cpu"), "fp32", hybrid=True)
    assert cpu.mfu == MEASURED[("cpu", "fp32", "dense")].mfu and "hybrid" in cpu.borrowed
    assert not mfu_row(hw("cpu"), "fp32", hybrid=False).borrowed


def test_train_seconds_cite_the_row_they_use():
    ctx = build_context(resolve(seeds_recipe("h200_x8"), QWEN36))
    t = next(t for t in ctx.training.terms if t.key == "train.seconds")
    assert t.inputs["mfu"] == MEASURED[("hopper", "bf16", "hybrid")].mfu
    assert "train_step.json" in t.inputs["mfu_source"] and "borrowed" not in t.inputs["mfu_source"]


def _sync(hardware: str, **overrides):
    recipe = resolve(seeds_recipe(hardware, **overrides), QWEN36)
    return recipe, grad_sync(recipe, recipe.drafter.dims.trainable)


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_gradient_sync_volume_follows_the_zero_stage(zero):
    recipe, sync = _sync("rtx_pro_6000_x4", stages__train__zero_stage=zero)
    train, params = recipe.stages.train, recipe.drafter.dims.trainable
    n = train.world_size
    rounds = train.grad_accum + 1 if zero == 2 else 2  # ZeRO-2 reduce-scatters every micro step
    assert sync.bytes_per_gpu == pytest.approx(rounds * (n - 1) / n * params * 2)  # bf16 gradients
    assert sync.seconds == pytest.approx(sync.bytes_per_gpu / 63e9)  # PCIe Gen5 x16, per direction


def test_gradient_sync_is_free_on_one_gpu_and_slower_over_pcie_than_nvlink():
    assert _sync("h200_x1")[1].seconds == 0.0
    tiny = resolve(tiny_recipe(), lookup("builtin:tiny-qwen3"))
    assert grad_sync(tiny, tiny.drafter.dims.trainable).seconds == 0.0  # the CPU profile: one process
    pcie = _sync("rtx_pro_6000_x4", stages__train__zero_stage=0)[1]
    nvlink = _sync("h200_x8", stages__train__zero_stage=0)[1]
    assert pcie.seconds > nvlink.seconds * 5
    two_nodes = resolve(seeds_recipe("h200_x8", hardware__nodes=2, hardware__internode_gbs=50.0), QWEN36)
    sync = grad_sync(two_nodes, two_nodes.drafter.dims.trainable)
    assert sync.seconds == pytest.approx(sync.bytes_per_gpu / 50e9)  # the slower link binds
    unknown = resolve(seeds_recipe("h200_x8", hardware__interconnect_gbs=None), QWEN36)
    missing = grad_sync(unknown, unknown.drafter.dims.trainable)
    assert missing.seconds == 0.0 and "not counted" in missing.term.inputs["note"]


def test_micro_batch_and_zero_stage_defaults_are_rules():
    def train(recipe, facts=QWEN36):
        return resolve(recipe, facts).stages.train

    assert (train(seeds_recipe()).micro_batch, train(seeds_recipe()).zero_stage) == (1, 2)
    assert (train(seeds_recipe("h200_x1")).micro_batch, train(seeds_recipe("h200_x1")).zero_stage) == (1, 0)
    tiny = train(tiny_recipe(), lookup("builtin:tiny-qwen3"))
    assert (tiny.micro_batch, tiny.zero_stage) == (2, 0)
    mine = train(seeds_recipe(stages__train__micro_batch=4, stages__train__zero_stage=1))
    assert (mine.micro_batch, mine.zero_stage) == (4, 1)
