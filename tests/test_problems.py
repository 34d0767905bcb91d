"""One problem-with-fix shape (`dflashx.config.problem.Problem`: code, key, message, fix) across the
five places that report one: recipe errors, plan findings, resolve errors, preflight checks and
export contract violations. Each instance here comes from the real code path that makes it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from _plan_recipes import REPO, seeds_recipe

from dflashx.config.errors import RecipeError
from dflashx.config.load import load_recipe
from dflashx.config.problem import Problem, describe
from dflashx.export.contract import need_block_size, report
from dflashx.plan.context import Totals
from dflashx.plan.plan import make_plan
from dflashx.resolve import ResolveError, resolve
from dflashx.run.checks_node import check_disk
from dflashx.targets.registry import lookup


def _recipe_problem(tmp_path: Path) -> Problem:
    with pytest.raises(RecipeError) as err:
        load_recipe(REPO / "recipes" / "tiny.yaml", ["stages.train.lrr=1"])
    [problem] = err.value.problems
    return problem


def _finding(tmp_path: Path) -> Problem:
    return next(f for f in make_plan(seeds_recipe(budget__max_days=1e-9)).errors if f.code == "budget_days")


def _resolve_error(tmp_path: Path) -> Problem:
    facts = lookup("Qwen/Qwen3.6-27B").model_copy(update={"mask_token_id": None})
    with pytest.raises(ResolveError) as err:
        resolve(seeds_recipe(drafter__mask_token_id=None), facts)
    return err.value


def _check(tmp_path: Path) -> Problem:
    return check_disk(str(tmp_path), Totals(storage_bytes=1e30), tmp_path / "run")


def _violation(tmp_path: Path) -> Problem:
    return need_block_size(1, "block_size")[0]


MAKERS = {"recipe error": _recipe_problem, "plan finding": _finding, "resolve error": _resolve_error,
          "preflight check": _check, "export violation": _violation}
EXPECTED = {  # code, key, a word of the fix
    "recipe error": ("recipe", "stages.train.lrr", "lr"),
    "plan finding": ("budget_days", "budget.max_days", "budget"),
    "resolve error": ("mask_token_unknown", "drafter.mask_token_id", "mask_token_id"),
    "preflight check": ("disk", "storage.root", "storage.root"),
    "export violation": ("export_contract", "block_size", "drafter.block_size"),
}


@pytest.mark.parametrize("kind", MAKERS)
def test_each_problem_type_exposes_code_key_message_and_fix(tmp_path, kind):
    problem = MAKERS[kind](tmp_path)
    assert isinstance(problem, Problem)
    code, key, fix_word = EXPECTED[kind]
    assert (problem.code, problem.key) == (code, key)
    assert isinstance(problem.message, str) and problem.message
    assert fix_word in problem.fix
    assert describe(problem) == f"{key}: {problem.message}; fix: {problem.fix}"


def test_exceptions_and_reports_carry_the_one_line_form(tmp_path):
    error, violation = _resolve_error(tmp_path), _violation(tmp_path)
    assert str(error) == describe(error) and str(violation) == describe(violation)
    assert f"  - {describe(violation)}" in report("sglang", [violation]).splitlines()


def test_a_type_missing_one_of_the_four_is_not_a_problem():
    @dataclass(frozen=True)
    class NoFix:
        code: str
        key: str
        message: str

    assert not isinstance(NoFix("c", "k", "m"), Problem)
