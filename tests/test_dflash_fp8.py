"""The frozen target in FP8 (`target.precision: fp8`): FP8Linear against the bf16 product, the swap
limited to the layers the capture runs, tapped features close to bf16, and the trainer with an FP8
target. `torch._scaled_mm` runs on this CPU, so nothing is mocked."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dflashx.dflash.capture import FeatureCapture, find_decoder_layers
from dflashx.dflash.fp8 import FP8Linear, check_fp8, target_to_fp8
from helpers_dflash import load_target, tiny_dataset, tiny_target, train_job


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_fp8_linear_is_close_to_bf16_and_stores_float8():
    torch.manual_seed(0)
    linear = nn.Linear(64, 48).to(torch.bfloat16)
    fp8 = FP8Linear(linear)
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        ref, out = linear(x), fp8(x)
    assert fp8.weight_t.dtype == torch.float8_e4m3fn and out.dtype == torch.bfloat16 and out.shape == (3, 5, 48)
    assert 0 < _rel(out, ref) < 0.06  # e4m3 keeps 3 mantissa bits: a few percent, never exact


def test_a_tokens_output_does_not_depend_on_the_other_tokens_in_the_batch():
    """Per-token activation scales: one large row (or padding) leaves the other rows' outputs alone,
    so captured features do not depend on batch composition and a one-token decode step matches."""
    torch.manual_seed(0)
    fp8 = FP8Linear(nn.Linear(64, 48).to(torch.bfloat16))
    x = torch.randn(6, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        alone = fp8(x[:1])
        x[3] *= 50  # an outlier token elsewhere in the batch
        together = fp8(x)[:1]
    assert torch.allclose(alone.float(), together.float(), rtol=1e-2, atol=1e-2)


def test_only_linears_of_the_tapped_depth_are_swapped_and_features_stay_close(tmp_path):
    model, _ = load_target(tiny_target(tmp_path / "t", layers=4))
    model = model.to(torch.bfloat16)
    ids = torch.randint(10, model.config.vocab_size, (2, 24))
    mask = torch.ones_like(ids)
    ref = FeatureCapture(model, [0, 2]).capture(ids, mask)
    layers = find_decoder_layers(model)
    swapped = target_to_fp8(model, torch.device("cpu"), depth=3)
    assert swapped == 3 * 7  # q, k, v, o, gate, up, down in each of layers 0..2
    assert not any(isinstance(m, FP8Linear) for m in layers[3].modules())
    assert isinstance(model.get_output_embeddings(), nn.Linear)  # the LM head stays bf16
    out = FeatureCapture(model, [0, 2]).capture(ids, mask)
    assert out.shape == ref.shape and 0 < _rel(out, ref) < 0.1


def test_check_fp8_accepts_this_cpu():
    check_fp8(torch.device("cpu"))  # raises with the recipe fix where a device lacks FP8


@pytest.mark.slow
def test_training_with_an_fp8_target_lowers_the_loss(tmp_path):
    from dflashx.dflash.trainer import run_training

    logs: dict[int, float] = {}
    job = train_job(tmp_path / "stage", tiny_dataset(tmp_path / "data", n=16), tiny_target(tmp_path / "target"),
                    precision="fp8", epochs=1, max_steps=24, lr=1e-2, global_batch=4, micro_batch=2, zero_stage=2,
                    anchors_per_seq=8, checkpoint_every=100, log_every=8)
    run_training(job, log=lambda m, step: logs.__setitem__(step, m["loss"]))
    assert logs[24] < logs[8]


@pytest.mark.slow
def test_fp8_target_counts_the_same_flops_as_the_plain_one(tmp_path):
    """FLOPs come from shapes: FP8Linear keeps its weights in buffers, yet the step counts the same."""
    from dflashx.dflash.trainer import run_training

    data, target = tiny_dataset(tmp_path / "data", n=16), tiny_target(tmp_path / "target")
    flops: dict[str, list[float]] = {}
    for precision in ("fp32", "fp8"):
        job = train_job(tmp_path / precision, data, target, precision=precision, epochs=1, max_steps=4, lr=1e-2,
                        global_batch=4, micro_batch=2, zero_stage=0, anchors_per_seq=8, checkpoint_every=100,
                        log_every=2)
        run_training(job, log=lambda m, step, p=precision: flops.setdefault(p, []).append(m["flops_per_step"]))
    assert flops["fp8"] == flops["fp32"] and all(f > 0 for f in flops["fp32"])
