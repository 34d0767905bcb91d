"""Fixed costs (dflashx/plan/estimates/fixed.py): who pays each part, that the stage times include them,
that --explain shows them, and that the constants are the figures of the benchmark JSON they cite."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _plan_recipes import REPO, seeds_recipe, tiny_recipe

from dflashx.plan.context import build_context
from dflashx.plan.estimates.fixed import (
    LOAD_RATE,
    MEDIANS_S,
    ONCE_PER_PROCESS,
    PARTS,
    PROVENANCE_IMPORTS,
    QC_FIGURES,
    checkpoint_saves,
    fixed_costs,
    process_parts,
    target_read_seconds,
)
from dflashx.plan.pilot import pilot_recipe
from dflashx.plan.plan import make_plan
from dflashx.resolve import resolve
from dflashx.targets.registry import lookup

TINY = lookup("builtin:tiny-qwen3")


def tiny(**overrides):
    return resolve(tiny_recipe(**overrides), TINY)


def payers(costs, part):
    return [stage for stage, parts in costs.parts.items() if part in parts]


def test_the_tiny_run_imports_each_library_once_in_its_first_user():
    costs = fixed_costs(tiny(), steps=100)
    assert payers(costs, "torch") == []  # the orchestrator imports it after ingest, for ingest's provenance
    assert payers(costs, "modeling") == ["generate"]  # the transformers backend loads the target first
    assert payers(costs, "matplotlib") == ["qc"]
    assert payers(costs, "figure_setup") == ["qc"] and payers(costs, "figure") == ["qc"]
    assert payers(costs, "eval_report") == ["eval"]  # its own figures and the predicted speed-up
    assert payers(costs, "datasets") == ["tokenize"]
    assert payers(costs, "wandb_service") == ["ingest"]
    assert payers(costs, "pandas") == ["ingest"]  # W&B's start imports it before datasets needs it
    assert payers(costs, "wandb_run") == ["ingest", "generate", "qc", "tokenize", "train", "eval", "export"]
    assert payers(costs, "target_load") == ["generate", "train", "eval"]
    assert payers(costs, "bookkeeping") == payers(costs, "wandb_run")  # each stage's, in the orchestrator
    assert payers(costs, "export") == ["export"] and payers(costs, "drafter_save") == ["train"]
    assert "backup" not in costs.parts  # disabled in recipes/tiny.yaml


def test_the_first_stage_pays_torch_when_it_needs_it():
    costs = fixed_costs(tiny(stages__ingest__enabled=False, stages__generate__backend="sglang"), steps=100)
    # servers' start-up: not measured
    assert costs.parts["generate"] == {"bookkeeping": 1, "wandb_service": 1, "pandas": 1, "wandb_run": 1}
    assert payers(costs, "torch") == []  # generate's provenance imported it before qc loads its tokenizer
    costs = fixed_costs(tiny(stages__ingest__enabled=False, stages__generate__enabled=False), steps=100)
    assert payers(costs, "torch") == ["qc"]  # its tokenizer load imports torch


def test_the_orchestrator_imports_torch_for_provenance():
    """The other side of PROVENANCE_IMPORTS: a stage's provenance record imports torch."""
    code = ("import sys; from dflashx.track.provenance import environment_facts; environment_facts(); "
            "print(sorted(m for m in ('torch', 'transformers', 'datasets', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout.split("\n")[-2]
    assert out == str(sorted(PROVENANCE_IMPORTS))


def test_tracking_disabled_drops_every_wandb_part():
    costs = fixed_costs(tiny(tracking__mode="disabled"), steps=100)
    assert not payers(costs, "wandb_service") and not payers(costs, "wandb_run")
    assert costs.parts["ingest"] == {"bookkeeping": 1}  # the orchestrator's, around every stage
    assert payers(costs, "pandas") == ["tokenize"]  # then datasets imports it


def test_launched_ranks_pay_their_own_process():
    recipe = resolve(seeds_recipe("h100_x8"), lookup("Qwen/Qwen3.6-27B"))
    assert recipe.stages.train.world_size > 1
    parts = fixed_costs(recipe, steps=10).parts
    assert {"interpreter", "torch", "modeling", "datasets"} <= parts["train"].keys()  # fresh processes
    assert "wandb_service" not in parts["train"]  # the W&B run stays in the dflashx run process
    assert "interpreter" not in set().union(*(p for s, p in parts.items() if s != "train"))


def test_a_run_after_its_pilot_in_the_process_pays_no_part_twice():
    """The pilot's stages leave their imports, the one-rank group (a lone trainer keeps it open) and DeepSpeed's
    set-up paid in the `dflashx run` process; the run that follows there pays only what it does each time."""
    pilot = resolve(pilot_recipe(tiny_recipe(tracking__mode="disabled"), True, 0), TINY)
    paid = process_parts(pilot)
    assert {"torch", "modeling", "pandas", "datasets", "process_group", "engine_setup"} <= paid
    assert not paid & {"matplotlib", "figure_setup"}  # the pilot draws no figure
    run = tiny(tracking__mode="disabled")
    cold, warm = fixed_costs(run, steps=100), fixed_costs(run, steps=100, paid=paid)
    assert payers(cold, "engine_setup") == payers(cold, "process_group") == ["train"]
    for part in ("process_group", "engine_setup", "modeling", "datasets", "pandas"):
        assert payers(warm, part) == [], part
    assert payers(warm, "engine") == ["train"] and payers(warm, "matplotlib") == ["qc"]
    assert warm.seconds["train"] == pytest.approx(
        cold.seconds["train"] - PARTS["process_group"].value - PARTS["engine_setup"].value)
    launched = resolve(seeds_recipe("h100_x8"), lookup("Qwen/Qwen3.6-27B"))  # its ranks are processes of their own
    assert not process_parts(launched) & {"process_group", "engine_setup"}


def test_checkpoint_saves_follow_the_trainers_rule():
    """The trainer saves when step % checkpoint_every == 0 or at the last step (dflash/trainer.py)."""
    for total, every in [(350, 50), (351, 50), (7, 50), (50, 50), (1, 1)]:
        saved = sum(1 for step in range(1, total + 1) if step % every == 0 or step == total)
        assert checkpoint_saves(total, every) == saved


def test_stage_seconds_are_work_plus_fixed_and_explained():
    plan = make_plan(tiny_recipe(), TINY)
    explained = {t["key"]: t for t in plan.to_json(explain=True)["explain"]}
    ctx = build_context(plan.resolved)
    work = {"ingest": "ingest.seconds", "qc": "qc.seconds", "tokenize": "tokenize.seconds", "eval": "eval.seconds",
            "export": "export.seconds", "generate": "generate.seconds", "train": "train.seconds"}
    for stage in plan.stages:
        if not stage.enabled:
            continue
        fixed = explained[f"{stage.name}.fixed_seconds"]
        assert fixed["value"] > 0
        assert stage.estimates.seconds == pytest.approx(explained[work[stage.name]]["value"] + fixed["value"])
        assert ctx.seconds[stage.name] == pytest.approx(stage.estimates.seconds)
    assert "modeling" in explained["generate.fixed_seconds"]["inputs"]


def test_the_constants_are_the_cited_measurements():
    """MEDIANS_S is the benchmark JSON's medians (CPU time; the interpreter's wall time), and each part is
    the median it names, less the one it names where the first figure includes it."""
    m = json.loads((REPO / "benchmarks/results/fixed_costs.json").read_text())["median_s"]
    for name, value in MEDIANS_S.items():
        assert value == pytest.approx(m[name if name == "interpreter" else f"{name}_cpu"], abs=0.006), name
    assert PARTS["modeling"].value == pytest.approx(MEDIANS_S["model_load_first"] - MEDIANS_S["model_load"])
    assert PARTS["wandb_service"].value == pytest.approx(MEDIANS_S["wandb_run_first"] - MEDIANS_S["wandb_run"])
    assert PARTS["engine"].value == MEDIANS_S["engine_build_again"]
    assert PARTS["engine_setup"].value == pytest.approx(MEDIANS_S["engine_build"] - MEDIANS_S["engine_build_again"])
    assert PARTS.keys() >= ONCE_PER_PROCESS


def test_qc_figures_are_the_reports_histograms():
    from dflashx.data.qc_report import HISTOGRAMS

    assert len(HISTOGRAMS) == QC_FIGURES
    assert fixed_costs(tiny(), steps=100).parts["qc"]["figure"] == len(HISTOGRAMS)


def test_a_target_load_reads_its_checkpoint_at_the_cited_rate():
    qwen = lookup("Qwen/Qwen3.6-27B")
    bf16 = resolve(seeds_recipe("h200_x1"), qwen)
    fp8 = resolve(seeds_recipe("h200_x1", target__precision="fp8"), qwen)
    assert target_read_seconds(bf16) == pytest.approx(qwen.total_params * 2 / LOAD_RATE.value)
    assert target_read_seconds(fp8) == target_read_seconds(bf16)  # read from the bf16 checkpoint
    assert target_read_seconds(tiny()) < 0.05  # the tiny target's 11 MB: its measured load already holds it
    eval_fixed = fixed_costs(bf16, steps=10).seconds["eval"]
    assert eval_fixed > target_read_seconds(bf16) > 30  # tens of GB: most of the stage's fixed time


def test_tokenize_per_sample_call_and_first_use_are_the_benchmarks_three_calls_apart():
    """The slope between the benchmark's 400- and 4,000-sample calls is the per-sample rate; the first call's excess
    over the same call again is paid once per process (a run after its pilot does not pay it)."""
    from benchmarks.fixed_costs import TOKENIZE_SAMPLES as measured_over
    from benchmarks.fixed_costs import TOKENIZE_SAMPLES_LARGE
    from dflashx.plan.estimates.fixed import TOKENIZE_PER_SAMPLE, TOKENIZE_SAMPLES

    assert measured_over == TOKENIZE_SAMPLES and TOKENIZE_SAMPLES_LARGE == 10 * TOKENIZE_SAMPLES
    slope = (MEDIANS_S["tokenize_large"] - MEDIANS_S["tokenize_again"]) / (TOKENIZE_SAMPLES_LARGE - TOKENIZE_SAMPLES)
    assert TOKENIZE_PER_SAMPLE.value == pytest.approx(slope, rel=1e-3)
    assert PARTS["tokenize_call"].value == pytest.approx(MEDIANS_S["tokenize_again"] - TOKENIZE_SAMPLES * slope,
                                                         abs=1e-3)
    assert PARTS["tokenize_setup"].value == pytest.approx(MEDIANS_S["tokenize_first"] - MEDIANS_S["tokenize_again"])
    assert "tokenize_setup" in ONCE_PER_PROCESS and "tokenize_call" not in ONCE_PER_PROCESS
    pilot = resolve(pilot_recipe(tiny_recipe(tracking__mode="disabled"), True, 0), TINY)
    run = tiny(tracking__mode="disabled")
    cold, warm = fixed_costs(run, steps=100), fixed_costs(run, steps=100, paid=process_parts(pilot))
    assert payers(cold, "tokenize_setup") == ["tokenize"] and payers(warm, "tokenize_setup") == []
    assert payers(warm, "tokenize_call") == ["tokenize"]
    plan = make_plan(tiny_recipe(), TINY).to_json(explain=True)
    term = next(t for t in plan["explain"] if t["key"] == "tokenize.seconds")
    assert term["inputs"]["per_sample_s"] == TOKENIZE_PER_SAMPLE.value
    assert term["value"] > term["inputs"]["per_sample_s"] * 256  # the recipe's 256 samples, each at the measured cost
