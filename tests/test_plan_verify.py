"""The verify forward at high concurrency (issue 40): a forward as the sum of its kinds of kernel, the weight GEMMs
turning compute-bound at batch x verified tokens, the speed-up falling below 1 past the crossover, the crossover
and each engine's switch-off setting, and the published curves of benchmarks/speedup_rows.py."""

from __future__ import annotations

import ast
import json

import pytest
from _plan_recipes import REPO, seeds_recipe

from dflashx.plan.estimates.decode import target_roofline
from dflashx.plan.estimates.deployment import predict_with, speedup_row
from dflashx.plan.estimates.device import device_of
from dflashx.plan.estimates.drafters import EAGLE3_DRAFT_VOCAB, eagle_drafter, eagle_layer_params
from dflashx.plan.estimates.engine import COPY_BANDWIDTH
from dflashx.plan.estimates.gemm import DENSE_EFFICIENCY, dense_efficiency
from dflashx.plan.estimates.serving import Batch
from dflashx.plan.expand.switch_off import CHECKED, switch_off_settings, vllm_schedule
from dflashx.resolve import resolve
from dflashx.resolve.speculative import geometric_profile
from dflashx.targets.registry import lookup


def resolved(target: str = "Qwen/Qwen3-8B", hardware: str = "h100_x8", **generate):
    recipe = seeds_recipe(hardware, target__model=target, target__mtp=False, drafter__architecture="dflash",
                          dataset__stats={"prompt_tokens_mean": 94, "output_tokens_mean": 165,
                                          "output_tokens_p90": 165.5},
                          stages__generate__max_tokens=166, stages__generate__hierarchical_cache=False,
                          stages__generate__serving={"tp": 1, "max_running_requests": 4096}, **generate)
    return resolve(recipe, lookup(target))


def batch(b: int, context: float = 200.0) -> Batch:
    return Batch(b, "client", {}, None, 0.0, 2, context)


def test_plain_decode_is_the_bytes_over_the_bandwidth_as_one_roofline_gave():
    """Every part memory-bound: the sum of the parts is the whole step's bytes at the copy rate."""
    r = resolved()
    dev = device_of(r.hardware)
    forward = target_roofline(r, dev, batch(8), "bf16")
    assert all(p.bound == "memory" for p in forward.parts)
    assert forward.seconds == pytest.approx(forward.bytes / (dev.bandwidth_bps * COPY_BANDWIDTH.value))


def test_the_verify_forwards_compute_share_grows_with_batch_times_block():
    r = resolved()
    dev = device_of(r.hardware)
    shares = [target_roofline(r, dev, batch(b), "bf16", tokens=4).compute_s
              / target_roofline(r, dev, batch(b), "bf16", tokens=4).seconds for b in (1, 16, 64, 128, 256)]
    assert shares == sorted(shares) and shares[0] < 0.05
    big = target_roofline(r, dev, batch(256), "bf16", tokens=4)
    assert big.bound == "compute"  # 1,024 rows: the weight GEMMs outgrow the weights' read
    # ... while each sequence's KV read stays memory-bound beside them: the forward is their sum, not their max
    attention = next(p for p in big.parts if p.name == "attention")
    assert attention.bound == "memory"
    assert big.seconds == pytest.approx(sum(p.seconds for p in big.parts))
    assert big.seconds > max(big.memory_s, big.compute_s)


def test_the_dense_gemm_efficiency_is_the_measured_table():
    rows = [m for m, _ in DENSE_EFFICIENCY]
    assert rows == sorted(rows)
    for m, e in DENSE_EFFICIENCY:
        assert dense_efficiency(m) == pytest.approx(e)
        assert 0 < e <= 1.05
    assert dense_efficiency(rows[0] / 2) == pytest.approx(DENSE_EFFICIENCY[0][1])  # held below the table


def test_an_eagle3_layer_is_the_published_architecture():
    llama = lookup("meta-llama/Llama-3.1-8B-Instruct")
    h, q, kv, ffn = 4096, 4096, 1024, 14336
    assert eagle_layer_params(llama, eagle3=True) == 2 * h * (q + 2 * kv) + q * h + 3 * h * ffn + 3 * h * h
    assert eagle_layer_params(llama, eagle3=False) == h * (q + 2 * kv) + q * h + 3 * h * ffn + 2 * h * h
    d = eagle_drafter(llama, True, 3, 1, 4, 2.4)
    assert d.weight_bytes == 2.0 * (eagle_layer_params(llama, True) + h * EAGLE3_DRAFT_VOCAB)
    assert (d.forwards, d.tokens, d.verify_tokens, d.drafts) == (3, 1, 4, 3)


def tree(r, tau: float = 2.92):
    """SpecDecode-Bench's widest tree: 21 drafts (top-4, depth 3), 22 verified tokens per sequence."""
    drafter = eagle_drafter(r.target.facts, True, 3, 4, 22, tau)
    return drafter, geometric_profile(tau, drafter.drafts)


def test_a_compute_bound_verify_falls_below_one_past_the_crossover():
    r = resolved()
    drafter, acceptance = tree(r)
    low, high = (speedup_row(r, drafter, acceptance, c) for c in (1, 128))
    assert low.pays and low.speedup > 1.3
    assert not high.pays and high.speedup < 0.8
    assert high.verify_compute_s > high.verify_memory_s


def test_the_crossover_is_reported_between_the_grid_points():
    r = resolved()
    drafter, acceptance = tree(r)
    d = predict_with(r, drafter, acceptance, drafter.verify_tokens, [1, 16, 64, 128], "test")
    above = d.switch_off_above
    assert above is not None and 16 <= above < 64
    assert speedup_row(r, drafter, acceptance, above).pays
    assert not speedup_row(r, drafter, acceptance, above + 1).pays
    assert f"turn speculation off above {above}" in d.crossover
    assert [s.engine for s in d.switch_off] == ["vLLM 0.32.0", "SGLang 0.5.23"]


def test_a_drafter_that_pays_everywhere_reports_no_crossover():
    r = resolved()
    drafter = eagle_drafter(r.target.facts, True, 3, 1, 4, 2.4)
    d = predict_with(r, drafter, geometric_profile(2.4, 3), 4, [1, 8, 32], "test")
    assert d.switch_off_above is None and "no crossover inside it" in d.crossover
    assert [s.engine for s in d.switch_off] == ["vLLM 0.32.0", "SGLang 0.5.23"]
    assert all(s.text.startswith("none needed on this grid") for s in d.switch_off)
    assert "[[1, N, 3], [N + 1, 65536, 0]]" in d.switch_off[0].text


def test_vllms_switch_is_its_dynamic_schedule_and_validates_in_vllm():
    [vllm, sglang] = switch_off_settings("dflash", 16, 40)
    spec = json.loads(vllm.text.split("'")[1])
    assert spec["method"] == "dflash" and spec["num_speculative_tokens"] == 15
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 40, 15], [41, 65536, 0]] == vllm_schedule(40, 15)
    assert "no switch for DFLASH" in sglang.text and "above 40 requests" in sglang.text
    utils = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")
    dense = utils.build_dynamic_sd_schedule_lookup(spec["num_speculative_tokens_per_batch_size"], 256, 15)
    assert dense[1] == dense[40] == 15 and dense[41] == dense[256] == 0


def test_sglang_switches_an_eagle_style_draft_off_through_its_adaptive_config():
    [_, sglang] = switch_off_settings("mtp", 4, 24, steps=3)
    assert "--speculative-adaptive" in sglang.text
    config = json.loads(sglang.text.split(" with ")[1].split(" (")[0])
    assert config == {"1": {"candidate_steps": [3]}, "25": {"candidate_steps": [0]}}


def test_no_switch_when_it_pays_nowhere_but_the_advice():
    [only] = switch_off_settings("dflash", 16, 0)
    assert "serve without it" in only.text


def test_the_switch_facts_are_read_at_the_releases_the_export_targets():
    from dflashx.export.engines import support

    assert {"vllm": support("vllm", "dflash").checked, "sglang": support("sglang", "dflash").checked} == CHECKED


def test_the_gemm_benchmarks_shapes_are_the_registrys():
    tree_ = ast.parse((REPO / "benchmarks" / "dense_gemm.py").read_text())
    shapes = next(ast.literal_eval(n.value) for n in tree_.body if isinstance(n, ast.Assign)
                  and getattr(n.targets[0], "id", "") == "SHAPES")
    for name, h, q, kv, ffn, vocab in shapes:
        f = lookup(name)
        assert (h, kv, ffn, vocab) == (f.hidden_size, f.num_kv_heads * f.head_dim, f.intermediate_size, f.vocab_size)
        assert q in (f.num_attention_heads * f.head_dim, 2 * f.num_attention_heads * f.head_dim)


def test_the_plan_prints_the_crossover_and_the_switches():
    from dflashx.cli.plan import deploy_lines

    r = resolved()
    drafter, acceptance = tree(r)
    lines = deploy_lines(predict_with(r, drafter, acceptance, 22, [1, 16, 64, 128], "test"))
    assert "turn speculation off above" in lines[1]
    assert lines[2].startswith("  vLLM 0.32.0: --speculative-config") and lines[3].startswith("  SGLang 0.5.23:")


def test_the_published_below_one_rows_are_predicted_below_1_05():
    from benchmarks.planner_accuracy import Row
    from benchmarks.speedup_rows import rows

    found, checks = rows(Row)
    below = [r for r in found if r.measured < 1.0]
    assert below and all(r.predicted < 1.05 for r in below)
    assert sum(r.measured < 1.0 for r in found) >= 1
    assert all(c["within_one_step"] for c in checks), checks
