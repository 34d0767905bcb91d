"""CPU stage times beside the fixed costs: eval through the in-process decoder, the transformers backend's
measured time per layer call."""

from __future__ import annotations

import json

import pytest
from _plan_recipes import REPO, tiny_recipe

from dflashx.plan.context import build_context
from dflashx.plan.estimates.device import Device
from dflashx.plan.estimates.engine import GEMM, TRANSFORMERS
from dflashx.plan.estimates.prefill import prefill_of
from dflashx.plan.plan import make_plan
from dflashx.resolve import resolve
from dflashx.resolve.flops import attention_flops
from dflashx.targets.registry import lookup

TINY = lookup("builtin:tiny-qwen3")
CPU = Device("cpu", None, 50e9, 1e12, None, 1)


def eval_term(**overrides):
    ctx = build_context(resolve(tiny_recipe(**overrides), TINY))
    return next(t for t in ctx.terms if t.key == "eval.seconds")


def test_cpu_eval_decodes_batched_at_the_deploy_models_cycle_for_its_rows():
    """The eval stage decodes every suite's prompts as one batch per drafter on the CPU too: each batch's cycles
    cost the deploy model's cycle at that many rows in flight (the sampled runs' batch, five times the rows, its
    own), and the cycle grows with the rows."""
    plan = make_plan(tiny_recipe(), TINY)
    rows = {r["concurrency"]: r for r in plan.to_json()["deploy"]["rows"]}
    term = eval_term()
    i, ev = term.inputs, plan.resolved.stages.eval
    prompts = 2 * ev.num_prompts  # the tiny recipe's two suites
    from dflashx.plan.estimates.host import in_process_cycle_seconds

    assert i["rows"] == prompts and i["cycle_s"] == in_process_cycle_seconds(plan.resolved, prompts)
    assert i["sampled_cycle_s"] == in_process_cycle_seconds(plan.resolved, prompts * ev.sampled_runs)
    assert i["sampled_cycle_s"] > 2 * i["cycle_s"]  # compute-bound: five times the rows
    assert rows[32]["cycle_s"] == pytest.approx(in_process_cycle_seconds(plan.resolved, 32))
    assert term.value == pytest.approx(i["cycles"] * i["cycle_s"] + i["sampled_cycles"] * i["sampled_cycle_s"])
    assert i["cycles"] == pytest.approx(i["longest_output"] / i["expected_tau"] + i["longest_output"])


def test_cpu_eval_grows_with_its_baselines_and_output_cap():
    full, alone = eval_term(), eval_term(stages__eval__baselines=[])
    i = full.inputs
    assert full.value - alone.value == pytest.approx(i["longest_output"] * i["cycle_s"])  # one batch at tau 1
    short = eval_term(stages__eval__max_new_tokens=8)
    assert short.inputs["longest_output"] == pytest.approx(8)
    assert short.value < full.value


def test_a_hybrid_target_on_the_cpu_decodes_one_prompt_at_a_time_at_the_deploy_models_batch_one_rate():
    """A target whose cache cannot roll rows back decodes one prompt after another: the in-process engine at
    batch 1, the deploy model's tokens/s at concurrency 1."""
    hybrid = lookup("builtin:tiny-qwen3_5")
    assert not hybrid.full_attention_only
    plan = make_plan(tiny_recipe(target__model="builtin:tiny-qwen3_5"), hybrid).to_json(explain=True)
    row = next(r for r in plan["deploy"]["rows"] if r["concurrency"] == 1)
    term = next(t for t in plan["explain"] if t["key"] == "eval.seconds")
    assert term["inputs"]["tokens_per_s_trained"] == pytest.approx(row["tokens_per_second_drafter"])
    assert term["inputs"]["tokens_per_s_baseline"] < term["inputs"]["tokens_per_s_trained"]  # tau 1 < expected


def test_the_transformers_row_is_the_cited_measurement():
    m = json.loads((REPO / "benchmarks/results/transformers_decode.json").read_text())
    assert TRANSFORMERS.call_latency is not None
    assert TRANSFORMERS.call_latency.value == pytest.approx(m["per_layer_call_s"], rel=1e-3)
    assert TRANSFORMERS.decode.value == 1.0  # the call latency replaces the share
    # and a prefill on it is the prompt's FLOPs at the ceiling plus its layer calls: no SGLang mixer term
    facts = TINY
    pre = prefill_of(facts, CPU, 1, "fp32", 64, False, TRANSFORMERS.engine, fixed_s=0.01)
    assert pre.mixer_s == 0 and pre.seconds == pytest.approx(
        pre.weight_gemm_s + attention_flops(facts, [64]) * facts.num_kv_layers / CPU.bf16_flops / GEMM.value + 0.01)


def test_the_tokenize_rate_is_the_benchmarks_stage_run_less_its_per_sample_work():
    """The per-token rate is read off benchmarks/results/tokenize.json's stage run (the figures it cites), with
    the per-sample work the fixed-cost benchmark measured taken out; the plan's tokenize term uses it."""
    from dflashx.plan.estimates.fixed import TOKENIZE_PER_SAMPLE
    from dflashx.plan.estimates.host import TOKENIZE_STAGE_RUN, TOKENIZE_TOKENS_PER_S_PER_PROC

    measured = json.loads((REPO / "benchmarks" / "results" / "tokenize.json").read_text())
    run = measured["stage"]
    cited = {"samples": run["samples"], "seconds": pytest.approx(run["seconds"], abs=5e-3), "tokens": run["tokens"],
             "num_proc": measured["num_proc"]}
    assert cited == TOKENIZE_STAGE_RUN
    per_process = run["seconds"] * measured["num_proc"] - run["samples"] * TOKENIZE_PER_SAMPLE.value
    assert TOKENIZE_TOKENS_PER_S_PER_PROC.value == pytest.approx(run["tokens"] / per_process, rel=1e-3)
    plan = make_plan(tiny_recipe(), TINY).to_json(explain=True)
    term = next(t for t in plan["explain"] if t["key"] == "tokenize.seconds")
    assert term["inputs"]["rate"] == TOKENIZE_TOKENS_PER_S_PER_PROC.value
    i = term["inputs"]
    assert term["value"] == pytest.approx((i["samples"] * TOKENIZE_PER_SAMPLE.value + i["tokens"] / i["rate"])
                                          / i["num_proc"])


def test_the_ingest_rate_is_the_benchmarks_seeds_scale_run():
    """The ingest rate is benchmarks/results/ingest_generate.json's 200,000-prompt run (prompts read / seconds), and
    the plan's ingest term divides the raw prompts by it."""
    from dflashx.plan.estimates.host import INGEST_PROMPTS_PER_S

    run = json.loads((REPO / "benchmarks" / "results" / "ingest_generate.json").read_text())["ingest_full"]
    assert INGEST_PROMPTS_PER_S.value == pytest.approx(run["prompts_in"] / run["seconds"], abs=1)
    plan = make_plan(tiny_recipe(), TINY).to_json(explain=True)
    term = next(t for t in plan["explain"] if t["key"] == "ingest.seconds")
    assert term["value"] == pytest.approx(term["inputs"]["raw_prompts"] / INGEST_PROMPTS_PER_S.value)
