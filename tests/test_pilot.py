"""`dflashx pilot`: real stages on the tiny recipe (in-process transformers, and SGLang's HTTP API served
by the scripted OpenAI-compatible server), calibration read by the next plan, the budget stop, and the
full generation reusing the pilot's completions (every prompt reaches the backend once)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from _plan_recipes import REPO, seeds_recipe
from openai_server import Script, ScriptedOpenAIServer, last_user
from typer.testing import CliRunner

from dflashx.backends.transformers_local import TransformersBackend
from dflashx.cli.main import app
from dflashx.data.jsonl import count_records, iter_shards
from dflashx.plan.calibration import PilotCalibration, conditions
from dflashx.plan.estimates.device import CALIBRATED_MFU, CALIBRATED_SERVING
from dflashx.plan.estimates.fixed import PARTS
from dflashx.run.layout import calibration_path
from dflashx.run.policy import pilot_due
from dflashx.run.rundir import load_plan
from dflashx.store.manifest import Manifest

runner = CliRunner()
PROMPTS, PILOT = 28, 12  # prompts after the eval holdout, and those the pilot generates


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread while the pilot trains and generates in this process: on shared CI cores, OpenMP
    threads waiting on a descheduled sibling slow the tiny model about sixfold (a pilot measured at 15 s
    with one thread took 88 s with two, at a load average of 5 on 2 cores)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_file(tmp: Path, **changes: Any) -> Path:
    """recipes/tiny.yaml with a 32-prompt source, a short pilot and its run folder under `tmp`."""
    data = yaml.safe_load((REPO / "recipes/tiny.yaml").read_text())
    data["dataset"]["sources"][0]["cap"] = PROMPTS + 4
    data["dataset"]["eval_holdout"] = 4
    data["storage"]["root"] = str(tmp / "runs")
    data["pilot"] = {"prompts": PILOT, "train_steps": 6}
    data["tracking"]["mode"] = "disabled"
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    path = tmp / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


def plan_json(recipe: Path, *extra: str) -> dict[str, Any]:
    return json.loads(invoke("plan", str(recipe), "--json", *extra).stdout)


@pytest.mark.slow  # real stages on the tiny recipe
@pytest.mark.timeout(300)
def test_pilot_in_process_calibrates_the_next_plan_and_its_completions_are_reused(tmp_path, monkeypatch):
    seen: list[str] = []
    real = TransformersBackend._generate_batch

    def counting(self, batch):  # the real generation; only the ids are noted
        seen.extend(p["id"] for p in batch)
        return real(self, batch)

    monkeypatch.setattr(TransformersBackend, "_generate_batch", counting)
    recipe = tiny_file(tmp_path)
    run_dir = tmp_path / "runs" / "tiny"
    before = plan_json(recipe)
    result = invoke("pilot", str(recipe))
    assert result.exit_code == 0, result.output
    for text in ("Estimate vs measured", "output tokens, mean", "training MFU", "generation tokens/s",
                 "with the pilot's figures", "dflashx plan` of this recipe now uses it", "held-out τ"):
        assert text in result.output, text
    assert len(seen) == PILOT

    cal = PilotCalibration.model_validate_json(calibration_path(run_dir).read_bytes())
    assert cal.stats["samples"] == PROMPTS  # the ingest's count, not the recipe's 256
    assert cal.measured["lengths"]["completions"] == PILOT
    assert cal.stats["generated"] == PILOT  # kept: the full generation resumes after them
    assert cal.decode_cycle_seconds and cal.decode_cycle_seconds > 0  # each probe's seconds per batched cycle
    assert 0 < cal.training_mfu <= 1 and cal.measured["training"]["windows"] >= 3
    assert cal.serving_ratio and cal.serving_ratio > 0
    ingest = next(r for r in map(json.loads, (run_dir / "records.jsonl").read_text().splitlines())
                  if r["event"] == "stage_end" and r["stage"] == "ingest")
    assert cal.ingest_seconds == ingest["duration_s"] > 0  # the run's own ingest, run by the pilot
    assert not (run_dir / "pilot" / "train" / "checkpoints").exists()  # full training states deleted
    # held-out τ in the pilot's training: the run's eval prompts registered in pilot/ as the train stage's input,
    # every ceil(6 / 4) = 2 steps, the curve in calibration.json; the drafters deleted with the states
    pilot = Manifest.load(run_dir / "pilot")
    heldout = pilot.get("ingest.eval_prompts")
    assert heldout is not None and (run_dir / "pilot" / heldout.path).read_bytes() == (
        run_dir / "ingest" / "eval_prompts.jsonl").read_bytes()
    train = next(r for r in map(json.loads, (run_dir / "pilot" / "records.jsonl").read_text().splitlines())
                 if r["event"] == "stage_end" and r["stage"] == "train")
    assert [step for step, _ in train["metrics"]["heldout_tau_curve"]] == [2, 4, 6]
    assert [p.step for p in cal.tau_curve] == [2, 4, 6] and all(p.tau >= 1 for p in cal.tau_curve)
    assert [[p.step, p.tau] for p in cal.tau_curve] == train["metrics"]["heldout_tau_curve"]
    assert not (run_dir / "pilot" / "train" / "checkpoint").exists()
    assert not (run_dir / "pilot" / "train" / "best-tau").exists()
    # the pilot's stages ran under the pilot's own plan: its recipe and estimates, not the full run's
    pilot_plan = load_plan(run_dir / "pilot" / "plan.json")
    full_plan = load_plan(run_dir / "plan.json")
    assert pilot_plan.resolved.stages.train.max_steps == 6 != full_plan.resolved.stages.train.max_steps
    assert pilot_plan.resolved.stages.train.tau_every == 2  # the pilot's interval, not the planner's
    assert pilot_plan.stage("train").estimates.seconds < full_plan.stage("train").estimates.seconds
    entry = Manifest.load(run_dir).get("pilot.calibration")  # inventory and backup see it
    assert entry is not None and entry.path == "pilot/calibration.json" and entry.tier == "replaceable"

    after = plan_json(recipe)
    assert before["calibration"] is None and after["calibration"]["run_id"] == cal.run_id
    applied = after["calibration"]["applied"]
    assert applied["dataset.stats.samples"] == PROMPTS
    # the generation left: the pilot's completions are kept, so the re-plan prices the rest of the prompts
    work = next(t for t in plan_json(recipe, "--explain")["explain"] if t["key"] == "generate.seconds")
    rate = work["inputs"]
    assert rate["generated"] == PILOT and rate["samples"] == PROMPTS
    assert work["value"] == pytest.approx((PROMPTS - PILOT) * rate["output_tokens_mean"] / rate["tokens_per_second"])
    assert after["calibration"]["tau_curve"] == [p.model_dump() for p in cal.tau_curve]  # for the rules
    assert applied[f"hardware.calibrated.{CALIBRATED_MFU}"] == pytest.approx(cal.training_mfu)
    # the ingest is done (the run skips it): the re-plan's ingest is the pilot's measured one
    assert next(s for s in after["stages"] if s["name"] == "ingest")["estimates"]["seconds"] == cal.ingest_seconds
    assert f"hardware.calibrated.{CALIBRATED_SERVING}" in applied
    assert after["ranges"]["output_tokens_mean"]["p50"] == pytest.approx(cal.stats["output_tokens_mean"], rel=0.02)
    human = invoke("plan", str(recipe)).output
    assert f"calibrated by the pilot of run {cal.run_id}" in human and f"dataset.stats.samples = {PROMPTS}" in human
    uncalibrated = plan_json(recipe, "--uncalibrated")
    assert uncalibrated["calibration"] is None and uncalibrated["totals"] == before["totals"]

    # measured under other generation settings: the lengths and the serving ratio no longer apply
    changed = plan_json(recipe, "stages.generate.max_tokens=64")["calibration"]
    skipped = {n["group"]: n["changed"] for n in changed["not_applied"]}
    assert skipped["data"] == ["stages.generate.max_tokens"] and "serving" in skipped
    assert f"hardware.calibrated.{CALIBRATED_MFU}" in changed["applied"]

    run = invoke("run", str(recipe), "--until", "generate", "--skip-preflight")
    assert run.exit_code == 0, run.output
    assert sorted(seen) == sorted(set(seen)) and len(seen) == PROMPTS  # the rest, none twice
    assert count_records(run_dir / "generate" / "completions") == PROMPTS


@pytest.mark.slow  # real stages on the tiny recipe
@pytest.mark.timeout(300)
def test_pilot_over_http_stops_on_the_budget_and_the_run_reuses_its_completions(tmp_path):
    with ScriptedOpenAIServer(Script(delay_s=0.01)) as server:
        # the recipe guesses 4 samples where the ingest finds 28: with 100 epochs the training steps, which scale
        # with the samples, outweigh the fixed costs (imports, loads, which do not, and which the pilot's re-plan
        # leaves out where the pilot paid them in its process), so the budget is 1.2x the guessed plan
        http = {"stages__generate__backend": "sglang", "stages__generate__urls": [server.url],
                "stages__generate__concurrency": 4, "dataset__stats__samples": 4, "stages__eval__enabled": False,
                "stages__train__epochs": 100}
        budget = plan_json(tiny_file(tmp_path, **http))["totals"]["days"] * 1.2
        recipe = tiny_file(tmp_path, **http, budget__max_days=budget)
        stopped = invoke("pilot", str(recipe))
        assert stopped.exit_code == 1, stopped.output
        assert "breaks the budget" in stopped.output and "[budget_days] budget.max_days" in stopped.output
        assert "--continue-over-budget" in stopped.output
        pilot_requests = len(server.requests)
        assert pilot_requests == PILOT

        replanned = plan_json(recipe)
        assert [e["code"] for e in replanned["errors"]] == ["budget_days"]
        assert replanned["calibration"]["applied"]["dataset.stats.samples"] == PROMPTS
        refused = invoke("run", str(recipe), "--until", "generate", "--skip-preflight")
        assert refused.exit_code == 1 and "nothing was run" in refused.output
        run = invoke("run", str(recipe), "--until", "generate", "--skip-preflight", "--continue-over-budget")
        assert run.exit_code == 0, run.output
    asked = Counter(last_user(body["messages"]) for body in server.requests)
    assert len(asked) == PROMPTS and set(asked.values()) == {1}  # every prompt once: the pilot's kept
    completions = list(iter_shards(tmp_path / "runs" / "tiny" / "generate" / "completions"))
    assert len({c["id"] for c in completions}) == len(completions) == PROMPTS


def test_run_pilots_first_on_a_gpu_profile_only_until_measured(tmp_path):
    no_gpu = {"hardware__gpu": None, "hardware__gpus_per_node": 0, "hardware__cpu_tflops": 0.1}
    gpu, cpu = seeds_recipe(), seeds_recipe("h200_x1", **no_gpu)
    assert pilot_due(gpu, tmp_path, None) and not pilot_due(cpu, tmp_path, None)
    assert not pilot_due(seeds_recipe(pilot__enabled=False), tmp_path, None)
    assert pilot_due(seeds_recipe("h200_x1", **no_gpu, pilot__enabled=True), tmp_path, None)
    measured = PilotCalibration(run_id="r", run_dir=str(tmp_path), measured_at="now", conditions=conditions(gpu),
                                stats={})
    assert not pilot_due(gpu, tmp_path, measured)  # measured under these values: not again
    assert pilot_due(seeds_recipe(stages__generate__max_tokens=4096), tmp_path, measured)


def _completion(i: int, source: str, tokens: int, finish: str = "stop") -> dict[str, Any]:
    return {"id": f"c{i}", "source": source, "usage": {"prompt_tokens": 20, "completion_tokens": tokens},
            "finish_reason": finish, "text_bytes": 3 * tokens}


def test_length_statistics_are_stratified_by_source():
    import statistics

    from dflashx.run.pilot_measure import length_stats

    a = [100, 120, 140, 160]  # a source with a small spread, 20% of the prompts
    b = [400, 800, 1200, 1600, 2000, 4096]  # a wide one, 80%; the last is cut at max_tokens
    records = [_completion(i, "a", x) for i, x in enumerate(a)]
    records += [_completion(10 + i, "b", x, "length" if x == 4096 else "stop") for i, x in enumerate(b)]
    stats, report = length_stats(records, {"a": 0.2, "b": 0.8}, max_tokens=4096, max_length=1024)
    se = ((0.2 * statistics.stdev(a)) ** 2 / 4 + (0.8 * statistics.stdev(b)) ** 2 / 6) ** 0.5
    assert stats["output_tokens_mean_se"] == pytest.approx(se)
    assert stats["output_tokens_mean"] == pytest.approx(statistics.fmean(a + b))
    assert stats["output_bytes_per_token"] == pytest.approx(3.0)
    assert report["truncated_share"] == pytest.approx(0.1) and report["truncated"] == 1
    assert report["train_cut_share"] == pytest.approx(4 / 10)  # 20 prompt tokens + output > 1024
    hist = stats["output_tokens_histogram"]
    assert hist["above"] == 1 and hist["edges"][-1] == 4096  # the cut completion is the open tail
    assert report["per_source"]["b"] == {"n": 6, "mean": pytest.approx(statistics.fmean(b)), "weight": 0.8}


@pytest.mark.slow  # real stages on the tiny recipe
@pytest.mark.timeout(300)
def test_a_pilot_that_measures_too_many_truncated_completions_stops(tmp_path):
    with ScriptedOpenAIServer(Script(length_every=3)) as server:  # a third stop at max_tokens
        recipe = tiny_file(tmp_path, stages__generate__backend="sglang", stages__generate__urls=[server.url],
                           stages__train__enabled=False)
        stopped = invoke("pilot", str(recipe), "--skip-preflight", "--continue-over-budget")
    assert stopped.exit_code == 1, stopped.output
    assert "the plan has errors" in stopped.output and "[generate_truncation]" in stopped.output
    cal = PilotCalibration.model_validate_json(calibration_path(tmp_path / "runs" / "tiny").read_bytes())
    assert cal.training_mfu is None and cal.measured["lengths"]["truncated_share"] > 0.05
    assert cal.stats["output_tokens_histogram"]["above"] == cal.measured["lengths"]["truncated"]


@pytest.mark.slow  # real stages on the tiny recipe
@pytest.mark.timeout(300)
def test_run_pilots_first_when_enabled_then_not_again(tmp_path):
    with ScriptedOpenAIServer(Script()) as server:
        recipe = tiny_file(tmp_path, stages__generate__backend="sglang", stages__generate__urls=[server.url],
                           pilot__enabled=True)
        first = invoke("run", str(recipe), "--until", "generate", "--skip-preflight")
        assert first.exit_code == 0, first.output
        assert "Estimate vs measured" in first.output and "pilot generate" in first.output
        assert calibration_path(tmp_path / "runs" / "tiny").is_file()
        # the run followed its pilot in this process: its train stage pays neither the one-rank group, nor
        # DeepSpeed's set-up, nor the modeling code (generation by a server loads no model), which the pilot's
        # training paid; `dflashx plan` later (a process of its own) counts them
        ran = load_plan(tmp_path / "runs" / "tiny" / "plan.json").stage("train").estimates.seconds
        later = next(s for s in plan_json(recipe)["stages"] if s["name"] == "train")["estimates"]["seconds"]
        assert later - ran == pytest.approx(sum(PARTS[p].value for p in ("process_group", "engine_setup", "modeling")))
        again = invoke("run", str(recipe), "--until", "generate", "--skip-preflight")
        skipped = invoke("run", str(recipe), "stages.generate.temperature=0.5", "--until", "ingest", "--skip-preflight")
    assert again.exit_code == 0 and "pilot generate" not in again.output  # measured already: no second pilot
    assert skipped.exit_code == 0 and "pilot generate" not in skipped.output  # generate not selected
    asked = Counter(last_user(body["messages"]) for body in server.requests)
    assert len(asked) == PROMPTS and set(asked.values()) == {1}
