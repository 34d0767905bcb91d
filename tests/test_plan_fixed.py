"""Fixed costs (dflashx/plan/estimates/fixed.py): who pays each part, that the stage times include them,
that --explain shows them, and that the constants are the figures of the benchmark JSON they cite."""

from __future__ import annotations

import json

import pytest
from _plan_recipes import REPO, seeds_recipe, tiny_recipe

from dflashx.plan.context import build_context
from dflashx.plan.estimates.fixed import ONCE_PER_PROCESS, PARTS, checkpoint_saves, fixed_costs
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
    assert payers(costs, "torch") == ["generate"]  # the transformers backend loads the target first
    assert payers(costs, "modeling") == ["generate"]
    assert payers(costs, "matplotlib") == ["qc"]
    assert payers(costs, "datasets") == ["tokenize"]
    assert payers(costs, "wandb_service") == ["ingest"]
    assert payers(costs, "wandb_run") == ["ingest", "generate", "qc", "tokenize", "train", "eval", "export"]
    assert payers(costs, "target_load") == ["generate", "train", "eval"]
    assert "backup" not in costs.parts  # disabled in recipes/tiny.yaml


def test_the_first_torch_user_pays_when_generation_is_served():
    costs = fixed_costs(tiny(stages__generate__backend="sglang"), steps=100)
    assert costs.parts["generate"] == {"wandb_run": 1}  # servers load the target: their start-up is not measured
    assert payers(costs, "torch") == ["qc"]  # its tokenizer load imports torch


def test_tracking_disabled_drops_every_wandb_part():
    costs = fixed_costs(tiny(tracking__mode="disabled"), steps=100)
    assert not payers(costs, "wandb_service") and not payers(costs, "wandb_run")
    assert costs.seconds["ingest"] == 0.0


def test_launched_ranks_pay_their_own_process():
    recipe = resolve(seeds_recipe("h100_x8"), lookup("Qwen/Qwen3.6-27B"))
    assert recipe.stages.train.world_size > 1
    train = fixed_costs(recipe, steps=10).parts["train"]
    assert {"interpreter", "torch", "modeling", "datasets"} <= train.keys()  # fresh processes: imported again
    assert "interpreter" not in set().union(*(p for s, p in fixed_costs(recipe, 10).parts.items() if s != "train"))


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
        assert stage.estimates["seconds"] == pytest.approx(explained[work[stage.name]]["value"] + fixed["value"])
        assert ctx.seconds[stage.name] == pytest.approx(stage.estimates["seconds"])
    assert "torch" in explained["generate.fixed_seconds"]["inputs"]


def test_the_constants_are_the_cited_measurements():
    """Each part is the benchmark's median it names (CPU time; differences where the figure says so)."""
    m = json.loads((REPO / "benchmarks/results/fixed_costs.json").read_text())["median_s"]
    cpu = {k: v for k, v in m.items() if k.endswith("_cpu")}
    expected = {
        "interpreter": m["interpreter"],
        "wandb_service": cpu["wandb_run_first_cpu"] - cpu["wandb_run_cpu"],
        "wandb_run": cpu["wandb_run_cpu"],
        "torch": cpu["import_torch_transformers_cpu"],
        "tokenizer": cpu["tokenizer_load_cpu"],
        "modeling": cpu["model_load_first_cpu"] - cpu["model_load_cpu"],
        "target_load": cpu["model_load_cpu"],
        "matplotlib": cpu["import_matplotlib_cpu"],
        "datasets": cpu["import_datasets_cpu"],
        "process_group": cpu["process_group_cpu"],
        "engine": cpu["engine_build_cpu"],
        "checkpoint": cpu["checkpoint_save_cpu"],
        "drafter_save": cpu["drafter_save_cpu"],
        "drafter_load": cpu["drafter_load_cpu"],
    }
    assert expected.keys() == PARTS.keys()
    for part, value in expected.items():
        assert PARTS[part].value == pytest.approx(value, abs=0.006), part
    assert ONCE_PER_PROCESS <= PARTS.keys()
