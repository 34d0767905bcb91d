"""Target facts: one path for the CLI and Python. `dflashx plan` passes `facts_for(recipe.target)`;
`make_plan` without facts uses the same function's registry rule and nothing else."""

from __future__ import annotations

import json

import yaml
from _plan_recipes import REPO, seeds_recipe
from helpers_models import tiny_target
from typer.testing import CliRunner

from dflashx.cli.main import app
from dflashx.config.load import load_recipe
from dflashx.plan.plan import make_plan
from dflashx.targets.facts import facts_for, registry_facts


def _local_recipe(tmp_path):
    target = tiny_target(tmp_path / "target")
    data = yaml.safe_load((REPO / "recipes" / "tiny.yaml").read_text())
    data["target"]["model"] = str(target)
    data["storage"] = {"root": str(tmp_path / "runs")}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_cli_and_python_plan_a_local_target_alike(tmp_path):
    path = _local_recipe(tmp_path)
    out = CliRunner().invoke(app, ["plan", str(path), "--json", "--uncalibrated"])
    assert out.exit_code == 0, out.output
    recipe = load_recipe(path).recipe
    python = make_plan(recipe, facts_for(recipe.target)).to_json()
    cli = json.loads(out.output)
    assert cli["resolved"]["target"]["facts"] == python["resolved"]["target"]["facts"]
    assert cli["totals"] == python["totals"]
    # without facts the pure planner reads no config.json: it says how to pass them
    bare = make_plan(recipe).to_json()
    assert [e["code"] for e in bare["errors"]] == ["unknown_target"]
    assert "facts_for(recipe.target)" in bare["errors"][0]["fix"]


def test_a_registry_target_plans_the_same_with_or_without_facts():
    recipe = seeds_recipe("h200_x1")
    assert facts_for(recipe.target) == registry_facts(recipe.target) is not None
    assert make_plan(recipe).to_json() == make_plan(recipe, facts_for(recipe.target)).to_json()
    by_arch = recipe.model_copy(update={"target": recipe.target.model_copy(update={"model": "elsewhere/x",
                                                                                    "arch": "Qwen/Qwen3.6-27B"})})
    assert registry_facts(by_arch.target) == registry_facts(recipe.target)
