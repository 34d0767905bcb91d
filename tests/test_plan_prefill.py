"""The prefill model (`dflashx.plan.estimates.prefill`, issue 29): the token mixers from their measurement and the
one TTFT source row, scaled by layer counts, prompt, bandwidth and TP; the MTP head's pass with its routed experts;
one formula for every planner_accuracy row."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from _plan_recipes import REPO

from dflashx.config.load import load_profile
from dflashx.plan.estimates import moe, prefill
from dflashx.plan.estimates.device import Device
from dflashx.targets.registry import REGISTRY, lookup

QWEN36, A3B = lookup("Qwen/Qwen3.6-27B"), lookup("Qwen/Qwen3.6-35B-A3B")
B200 = Device("B200", 192e9, 7.7e12, 2250e12, 4500e12, 1)


def sglang(facts, dev=prefill.SOURCE_DEVICE, tokens=8192.0, tp=1, dtype="bf16", draft=None):
    return prefill.prefill_of(facts, dev, tp, dtype, tokens, True, "sglang", draft or prefill.DraftPass())


def test_constants_are_the_measurements():
    data = json.loads((REPO / "benchmarks/results/prefill_mixers.json").read_text())
    assert data["seq"] == prefill.MIXER_TOKENS and "H100" in data["device"]
    rows = {(r["target"], r["layer"]): r["seconds_per_layer"] for r in data["rows"]}
    assert {k: m.value for k, m in prefill.MIXER_LAYERS.items()} == pytest.approx(rows, abs=5e-7)
    for device, name in ((prefill.MIXER_DEVICE, "h100_x8"), (prefill.SOURCE_DEVICE, "h200_x1")):
        gpu = load_profile(name).gpu
        assert gpu is not None and gpu.bandwidth_tbs is not None and gpu.bf16_tflops is not None
        assert (device.bandwidth_bps, device.bf16_flops) == (gpu.bandwidth_tbs * 1e12, gpu.bf16_tflops * 1e12)
    assert (prefill.MIXER_DEVICE.bandwidth_bps, prefill.SOURCE_DEVICE.bandwidth_bps) == (3.35e12, 4.8e12)


def test_the_source_row_reproduces_by_construction():
    pre = sglang(QWEN36, draft=prefill.mtp_prompt_pass(QWEN36))
    assert pre.seconds == pytest.approx(prefill.TTFT_SOURCE.value)
    factor = prefill.mixer_factor()
    assert 0 < factor.value < 1  # SGLang's mixers are faster than transformers' reference convolution and SDPA
    assert pre.mixer_s == pytest.approx(factor.ttft_s - factor.priced_s)


def test_the_mixer_term_scales_with_layer_counts_prompt_bandwidth_and_tp():
    base = sglang(QWEN36)
    rest = {t: prefill.rest_per_token(QWEN36, t) for t in (prefill.LINEAR, prefill.ATTENTION)}
    assert rest[prefill.LINEAR] > rest[prefill.ATTENTION] > 0
    scale = prefill.mixer_factor().value * 8192
    assert base.mixer_s == pytest.approx(scale * (48 * rest[prefill.LINEAR] + 16 * rest[prefill.ATTENTION]))
    types = ["linear_attention"] * 6 + ["full_attention"] * 2
    fewer = QWEN36.model_copy(update={"num_layers": 8, "layer_types": types})
    assert sglang(fewer).mixer_s == pytest.approx(scale * (6 * rest[prefill.LINEAR] + 2 * rest[prefill.ATTENTION]))
    assert sglang(QWEN36, tokens=4096).mixer_s == pytest.approx(base.mixer_s / 2)  # linear in the prompt
    assert sglang(QWEN36, B200).mixer_s == pytest.approx(base.mixer_s * 4.8 / 7.7)  # the bandwidth ratio
    assert sglang(QWEN36, tp=2).mixer_s == pytest.approx(base.mixer_s / 2)
    # FP8 weights re-time the weight GEMMs only
    fp8 = sglang(QWEN36, dtype="fp8")
    assert fp8.mixer_s == base.mixer_s and fp8.attention_s == base.attention_s
    assert fp8.weight_gemm_s < base.weight_gemm_s


def test_a_target_is_scaled_by_its_own_measurement_or_by_mixer_width():
    """The 35B-A3B's mixers are its measured layers (not the 27B's scaled by FLOPs); an unmeasured shape (a dense
    target's attention) scales the measured targets' mean per unit of width."""
    ratio = sglang(A3B).mixer_s / sglang(QWEN36).mixer_s
    measured = ((30 * prefill.rest_per_token(A3B, prefill.LINEAR) + 10 * prefill.rest_per_token(A3B, prefill.ATTENTION))
                / (48 * prefill.rest_per_token(QWEN36, prefill.LINEAR)
                   + 16 * prefill.rest_per_token(QWEN36, prefill.ATTENTION)))
    assert ratio == pytest.approx(measured) and 0.3 < ratio < 0.5
    per_width = [prefill.rest_per_token(f, prefill.ATTENTION) / prefill.mixer_width(f, prefill.ATTENTION)
                 for f in (QWEN36, A3B)]
    dense = REGISTRY["Qwen/Qwen3-32B"]
    assert prefill.rest_per_token(dense, prefill.ATTENTION) == pytest.approx(64 * 128 * sum(per_width) / 2)
    assert sglang(dense).mixer_s > 0 and prefill.rest_per_token(dense, prefill.LINEAR) == 0


def test_off_sglang_or_the_gpu_there_is_no_mixer_term():
    for on_gpu, engine in ((False, "sglang"), (True, "transformers"), (True, "in-process")):
        pre = prefill.prefill_of(QWEN36, prefill.SOURCE_DEVICE, 1, "bf16", 8192, on_gpu, engine)
        assert pre.mixer_s == 0 and pre.mixer_rest_s == 0


def test_the_mtp_heads_prompt_pass_runs_its_routed_experts_through_moe_layer():
    draft = prefill.mtp_prompt_pass(A3B)
    assert draft.moe_layers == 1 and draft.attention_layers == 1
    assert draft.gemm_flops_per_token == pytest.approx(
        2.0 * prefill.mtp_layer_params(A3B) - moe.routed_flops_per_token(A3B, 1))
    plain, mtp = sglang(A3B), sglang(A3B, draft=draft)
    assert mtp.moe_layers == plain.moe_layers == A3B.num_moe_layers and mtp.draft_moe_layers == 1
    assert mtp.moe_s - plain.moe_s == pytest.approx(plain.moe.seconds)
    assert mtp.mixer_s > plain.mixer_s  # its attention layer over the prompt
    # Served FP8, the target's experts are FP8 but the MTP head's stay 16-bit (as its decode and served weights)
    fp8 = sglang(A3B, dtype="fp8", draft=draft)
    assert fp8.draft_moe.weight_bytes == pytest.approx(2 * fp8.moe.weight_bytes) == pytest.approx(
        plain.moe.weight_bytes)
    assert fp8.moe_s - sglang(A3B, dtype="fp8").moe_s == pytest.approx(fp8.draft_moe.seconds)
    dense = prefill.mtp_prompt_pass(QWEN36)
    assert dense.moe_layers == 0 and dense.gemm_flops_per_token == 2.0 * prefill.mtp_layer_params(QWEN36)


def test_every_ttft_row_runs_through_the_one_function(monkeypatch):
    """Changing the 35B-A3B's measured Gated DeltaNet layer moves its TTFT rows and no 27B row; changing the source
    TTFT moves every SGLang TTFT row, and the source row follows it (by construction)."""
    from benchmarks import planner_accuracy as pa

    def ttft() -> dict[str, float]:
        return {r.reference: r.predicted for r in pa.serving_rows() + pa.moe_rows() if "first token" in r.reference}

    before = ttft()
    key = ("Qwen/Qwen3.6-35B-A3B", prefill.LINEAR)
    doubled = replace(prefill.MIXER_LAYERS[key], value=2 * prefill.MIXER_LAYERS[key].value)
    layers = {**prefill.MIXER_LAYERS, key: doubled}
    monkeypatch.setattr(prefill, "MIXER_LAYERS", layers)
    after = ttft()
    for name, value in before.items():
        assert (after[name] > 1.2 * value) if "35B-A3B" in name else (after[name] == pytest.approx(value)), name
    monkeypatch.setattr(prefill, "TTFT_SOURCE", replace(prefill.TTFT_SOURCE, value=0.8))
    moved = ttft()
    assert moved["Qwen3.6-27B BF16 on H200, time to first token"] == pytest.approx(0.8)
    assert all(moved[name] > after[name] for name in before)
