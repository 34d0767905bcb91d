"""The serving model: SGLang's pool sizing decides the batch, the servers keep it in flight, and the
estimate follows the physics across GPUs, TP layouts and links (no per-profile constant)."""

from __future__ import annotations

import pytest
from _plan_recipes import profile, seeds_recipe

from dflashx.plan.context import build_context
from dflashx.plan.estimates.engine import COPY_BANDWIDTH, GEMM, GEMM_FP8, SGLANG_HYBRID
from dflashx.plan.estimates.lengths import OutputLengths
from dflashx.plan.estimates.serving import STATE_SLOTS_PER_REQUEST, mean_running_context, running_batch
from dflashx.plan.plan import make_plan
from dflashx.resolve import resolve
from dflashx.resolve.flops import target_forward_flops
from dflashx.targets.registry import lookup

QWEN36, QWEN3_8B = lookup("Qwen/Qwen3.6-27B"), lookup("Qwen/Qwen3-8B")


def gen(recipe, facts=QWEN36):
    return build_context(resolve(recipe, facts)).generation


def term(g, key):
    return next(t for t in g.terms if t.key == key)


def test_no_profile_holds_an_efficiency_or_serving_key():
    for name in ("rtx_pro_6000_x4", "b200_nvl8", "h200_x1", "h200_x8", "h100_x8", "cpu"):
        data = profile(name)
        assert "serving" not in data and "efficiency" not in str(data)


def test_state_pool_caps_the_rtx_batch_as_sglang_sizes_it():
    """96 GB RTX: (102.6 GB x 0.85 - 55.6 GB) x 0.9/1.9 of state pool / 154 MB per state / 5 slots; with
    the MTP head each running request also holds one state per verified token (4)."""
    r = resolve(seeds_recipe(target__mtp=False), QWEN36)
    b = running_batch(r, OutputLengths.of(r.dataset.stats))
    rest = 102.6e9 * 0.85 - b.weight_bytes
    slots = int(rest * 0.9 / 1.9 // QWEN36.recurrent_state_bytes) - 1
    assert b.binding == "state_pool" and b.value == slots // STATE_SLOTS_PER_REQUEST == 19
    assert b.caps["max_running_requests"] == 256 and b.caps["kv_pool"] > b.value
    mtp = resolve(seeds_recipe(), QWEN36)
    with_mtp = running_batch(mtp, OutputLengths.of(mtp.dataset.stats))
    assert with_mtp.value == slots // (STATE_SLOTS_PER_REQUEST + 4) == 10
    assert with_mtp.caps["kv_pool"] < b.caps["kv_pool"]  # the MTP layer's KV: 17 attention layers, not 16


def test_running_context_is_length_biased():
    lengths = OutputLengths.through(1818)  # CV 1: E[O^2] / (2 E[O]) = mean
    assert mean_running_context(255, lengths, 10**9) == pytest.approx(255 + 1818, rel=1e-6)
    assert mean_running_context(255, lengths, 2000) < 255 + 1818  # max_tokens clips the long tail


def test_servers_keep_the_planned_batch_in_flight():
    for hardware in ("rtx_pro_6000_x4", "b200_nvl8"):
        plan = make_plan(seeds_recipe(hardware)).to_json()
        g = next(s for s in plan["stages"] if s["name"] == "generate")
        replicas = sum(int(s["command"][s["command"].index("--dp-size") + 1]) if "--dp-size" in s["command"]
                       else 1 for s in g["servers"])
        assert sum(s["in_flight"] for s in g["servers"]) == replicas * g["in_flight_per_replica"]
        assert g["in_flight_per_replica"] == gen(seeds_recipe(hardware)).serving.batch


def test_client_concurrency_caps_the_batch_and_says_so():
    g = gen(seeds_recipe("b200_nvl8", stages__generate__concurrency=8))
    assert g.serving.batch == 8 and g.serving.binding == "client"
    assert g.seconds > gen(seeds_recipe("b200_nvl8")).seconds


def test_h100_from_the_datasheet_is_slower_than_h200_by_at_least_the_bandwidth_ratio():
    bandwidth_ratio = 4.8 / 3.35
    h100, h200 = gen(seeds_recipe("h100_x8")), gen(seeds_recipe("h200_x8"))
    assert h100.seconds / h200.seconds >= bandwidth_ratio  # 80 GB also holds fewer Qwen3.6 states
    # a dense 8B target whose batch both GPUs cap at 64: the ratio is the bandwidth ratio
    dense = {"target__model": "Qwen/Qwen3-8B", "drafter__mask_token_id": None,
             "stages__generate__serving__max_running_requests": 64}
    small_h100, small_h200 = gen(seeds_recipe("h100_x8", **dense), QWEN3_8B), gen(seeds_recipe("h200_x8", **dense),
                                                                                  QWEN3_8B)
    assert small_h100.serving.batch == small_h200.serving.batch == 64
    assert small_h100.seconds / small_h200.seconds == pytest.approx(bandwidth_ratio, rel=0.1)


def test_tp2_dp2_over_pcie_is_slower_than_tp1_dp4_for_a_model_that_fits_one_gpu():
    dense = {"target__model": "Qwen/Qwen3-8B", "drafter__mask_token_id": None,
             "stages__generate__serving__max_running_requests": 128}
    tp1 = gen(seeds_recipe("rtx_pro_6000_x4", **dense), QWEN3_8B)
    tp2 = gen(seeds_recipe("rtx_pro_6000_x4", stages__generate__serving__tp=2, **dense), QWEN3_8B)
    assert (tp1.serving.tp, tp1.serving.dp, tp2.serving.tp, tp2.serving.dp) == (1, 4, 2, 2)
    assert tp2.seconds > tp1.seconds
    assert term(tp1, "generate.step_seconds").inputs["allreduce_s"] == 0
    assert term(tp2, "generate.step_seconds").inputs["allreduce_s"] > 0
    # the same layout over NVLink pays far less for its all-reduces
    nvlink = gen(seeds_recipe("rtx_pro_6000_x4", stages__generate__serving__tp=2, hardware__interconnect_gbs=450,
                              **dense), QWEN3_8B)
    assert term(nvlink, "generate.step_seconds").inputs["allreduce_s"] < term(tp2, "generate.step_seconds").inputs[
        "allreduce_s"] / 3


def test_tp_auto_is_the_smallest_that_fits():
    assert resolve(seeds_recipe("h100_x8"), QWEN36).stages.generate.serving.tp == 1
    tiny_gpu = seeds_recipe("h100_x8", hardware__gpu__memory_gb=40)  # 55.6 GB of weights need two
    assert resolve(tiny_gpu, QWEN36).stages.generate.serving.tp == 2
    assert resolve(tiny_gpu, QWEN36).stages.generate.serving.dp == 4


def test_explain_names_the_engine_sources():
    step = term(gen(seeds_recipe()), "generate.step_seconds").inputs
    assert step["copy_share"] == COPY_BANDWIDTH.value and step["gemm_share"] == GEMM.value
    assert step["decode_share"] == SGLANG_HYBRID.decode.value and "PR #32959" in step["decode_share_source"]


def test_fp8_weights_speed_up_only_the_weight_gemms_of_a_prefill():
    """FP8 re-times the target's weight GEMMs at the FP8 GEMM ceiling and leaves the rest (attention core, the
    token mixers, the MTP head's pass in 16 bits) as it was."""
    bf16 = term(gen(seeds_recipe("h200_x8")), "generate.prefill_seconds").inputs
    fp8 = term(gen(seeds_recipe("h200_x8", stages__generate__serving={"weight_dtype": "fp8"})),
               "generate.prefill_seconds").inputs
    rest = ("draft_gemm_s", "attention_s", "mixer_s")
    assert all(fp8[k] == pytest.approx(bf16[k]) for k in rest) and bf16["mixer_s"] > 0
    gemm_ratio = (1979 * GEMM_FP8.value) / (989 * GEMM.value)
    assert fp8["weight_gemm_s"] == pytest.approx(bf16["weight_gemm_s"] / gemm_ratio)
    total_bf16, total_fp8 = (t["weight_gemm_s"] + sum(t[k] for k in rest) for t in (bf16, fp8))
    assert 1.0 < total_bf16 / total_fp8 < gemm_ratio  # faster, by less than the GEMM ceilings' ratio


def test_prefill_prices_the_prompt_flops_at_the_gemm_ceiling_and_adds_the_mixers():
    """Weight GEMMs and attention core together are the one FLOP model's prompt FLOPs at the bf16 ceiling; the
    token mixers come on top (SGLang on a GPU)."""
    r = resolve(seeds_recipe("h200_x8", target__mtp=False), QWEN36)
    pre = term(build_context(r).generation, "generate.prefill_seconds")
    facts, i = r.target.facts, pre.inputs
    flops = target_forward_flops(facts, facts.num_layers - 1, [r.dataset.stats.prompt_tokens_mean])
    assert i["weight_gemm_s"] + i["attention_s"] == pytest.approx(flops / (989e12 * GEMM.value))
    assert i["draft_gemm_s"] == 0 and i["mixer_s"] > 0 and i["mixer"]["factor"] > 0
    assert pre.value == pytest.approx(flops / (989e12 * GEMM.value) + i["mixer_s"])


def test_fp8_decode_keeps_the_engine_overhead_of_a_16_bit_step():
    bf16 = term(gen(seeds_recipe("h200_x8")), "generate.step_seconds")
    fp8 = term(gen(seeds_recipe("h200_x8", stages__generate__serving={"weight_dtype": "fp8"})),
               "generate.step_seconds")
    # the overhead is the 16-bit roofline's, at FP8's own batch: larger than FP8's roofline would give
    assert fp8.inputs["memory_s"] < bf16.inputs["memory_s"]
    overhead = bf16.inputs["overhead_s"] / bf16.inputs["memory_s"]
    assert overhead == pytest.approx(1 / SGLANG_HYBRID.decode.value - 1)
    assert fp8.inputs["overhead_s"] > fp8.inputs["memory_s"] * overhead  # not shrunk with the FP8 bytes
