"""`dflashx.run.session.run_recipe`'s policy, called directly (not through the CLI): what stops a run
before it spends anything (plan errors, budget.* unless continuing over budget, a failed preflight),
when the pilot runs first and that its re-plan is what the stages run with, the retrain hint.

The stages are the orchestrator tests' fakes (tests/test_run_fakes.py). The pilot handed to
`run_recipe` is a stand-in returning a re-plan: the real pilot generates and trains, which
tests/test_pilot.py runs end to end through `dflashx pilot` / `dflashx run`; here only the policy
around it is under test.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
import test_run_fakes as fakes

from dflashx.config.schema import Recipe
from dflashx.plan.calibration import PilotCalibration
from dflashx.plan.findings import Finding
from dflashx.plan.plan import Plan, make_plan
from dflashx.report.lines import EchoObserver
from dflashx.run import orchestrator
from dflashx.run.check import Check
from dflashx.run.graph import select
from dflashx.run.pilot import PilotOutcome
from dflashx.run.rundir import RunDir
from dflashx.run.session import RunRequest, Stopped, pilot_recipe, run_recipe
from dflashx.targets.registry import lookup

STATS = {"samples": 4, "prompt_tokens_mean": 20, "output_tokens_mean": 10, "output_tokens_p90": 12}
FACTS = lookup("builtin:tiny-qwen3")


@pytest.fixture(autouse=True)
def fake_stages(monkeypatch):
    monkeypatch.setattr(orchestrator, "load_stage", fakes.fake_load_stage)
    monkeypatch.setattr(logging.getLogger("dflashx"), "handlers", [])
    fakes.CALLS.clear()


class View(EchoObserver):
    """A SessionView keeping everything it is shown, in order."""

    def __init__(self) -> None:
        self.shown: list[str] = []
        super().__init__(self.shown.append)
        self.found: list[Finding] = []
        self.checks: list[Check] = []
        self.piloted: list[PilotOutcome] = []

    def line(self, text: str) -> None:
        self.shown.append(text)

    def findings(self, findings: Sequence[Finding]) -> None:
        self.found += findings

    def preflight(self, checks: Sequence[Check]) -> None:
        self.checks += checks

    def pilot_measured(self, outcome: PilotOutcome) -> None:
        self.piloted.append(outcome)
        self.shown.append("pilot measured")


class Pilot:
    """Stands in for `run_pilot`: records the call and returns `after` as the re-plan."""

    def __init__(self, after: Plan):
        self.after, self.calls = after, 0

    def __call__(self, recipe: Recipe, plan: Plan, run_dir: Path, observer: Any, held: Any,
                 argv: Iterable[str]) -> PilotOutcome:
        self.calls += 1
        assert not fakes.CALLS, "the pilot runs before any stage"
        assert RunDir(run_dir).is_locked(), "the session holds the run lock for the pilot"
        return PilotOutcome(PilotCalibration.model_construct(), run_dir / "pilot" / "calibration.json",
                            plan, self.after)


def _recipe(tmp_path: Path, **changes: Any) -> Recipe:
    source = fakes.write_prompts(tmp_path / "prompts.jsonl")
    base = {"dataset.stats": STATS, "stages.generate": {"backend": "transformers", "max_tokens": 16}}
    return fakes.make_recipe(source, **base | changes)


def _request(tmp_path: Path, recipe: Recipe, **options: Any) -> RunRequest:
    return RunRequest(recipe, tmp_path / "recipe.yaml", FACTS, **{"run_dir": tmp_path / "run"} | options)


def test_a_broken_budget_stops_before_anything_runs_unless_continuing_over_budget(tmp_path):
    recipe = _recipe(tmp_path, **{"budget.max_days": 1e-9})
    view = View()
    with pytest.raises(Stopped) as stop:
        run_recipe(_request(tmp_path, recipe), view)
    assert stop.value.exit_code == 1 and "the plan has 1 error(s); nothing was run" in stop.value.message
    assert "--continue-over-budget" in stop.value.message
    assert [f.code for f in view.found if f.severity == "error"] == ["budget_days"]
    assert not (tmp_path / "run").exists() and not fakes.CALLS

    session = run_recipe(_request(tmp_path, recipe, continue_over_budget=True), View())
    assert session.ok and fakes.CALLS["export"] == 1
    assert json.loads((tmp_path / "run" / "plan.json").read_text())["errors"][0]["code"] == "budget_days"


def test_continuing_over_budget_never_lets_another_error_through(tmp_path):
    too_long = STATS | {"output_tokens_mean": 15, "output_tokens_p90": 100}  # generate_truncation
    recipe = _recipe(tmp_path, **{"budget.max_days": 1e-9, "dataset.stats": too_long})
    with pytest.raises(Stopped) as stop:
        run_recipe(_request(tmp_path, recipe, continue_over_budget=True), View())
    assert "the plan has 1 error(s); nothing was run" in stop.value.message
    assert "--continue-over-budget" not in stop.value.message and not fakes.CALLS


def test_a_failed_preflight_stops_the_run_and_skipping_it_does_not(tmp_path):
    recipe = _recipe(tmp_path)
    (tmp_path / "prompts.jsonl").unlink()  # the preflight checks the sources exist
    view = View()
    with pytest.raises(Stopped, match="the preflight failed; nothing was run"):
        run_recipe(_request(tmp_path, recipe, selection=select(until="ingest")), view)
    assert any(c.status == "fail" for c in view.checks) and not fakes.CALLS
    skipped = run_recipe(_request(tmp_path, recipe, selection=select(until="ingest"), preflight=False), View())
    assert not skipped.ok and fakes.CALLS["ingest"] == 1  # the fake ingest then fails on the missing file


def test_the_pilot_runs_first_when_due_and_the_stages_run_with_its_replan(tmp_path):
    recipe = _recipe(tmp_path, **{"pilot.enabled": True})
    after = make_plan(recipe.model_copy(update={"description": "re-planned"}), FACTS)
    pilot, view = Pilot(after), View()
    session = run_recipe(_request(tmp_path, recipe), view, pilot=pilot)
    assert pilot.calls == 1 and session.ok and session.plan is after
    assert json.loads((tmp_path / "run" / "plan.json").read_text())["resolved"]["description"] == "re-planned"
    assert view.shown.index("pilot measured") < next(i for i, s in enumerate(view.shown) if s.startswith("> ingest"))


@pytest.mark.parametrize("changes, options", [
    ({"pilot.enabled": False}, {}),
    ({"pilot.enabled": "auto"}, {}),  # auto: a GPU profile only; the fakes run on the CPU profile
    ({"pilot.enabled": True}, {"pilot": False}),  # --skip-pilot
    ({"pilot.enabled": True}, {"selection": select(until="ingest")}),  # generate not selected
])
def test_the_pilot_does_not_run_when_not_due(tmp_path, changes, options):
    recipe = _recipe(tmp_path, **changes)
    pilot = Pilot(make_plan(recipe, FACTS))
    assert run_recipe(_request(tmp_path, recipe, **options), View(), pilot=pilot).ok
    assert pilot.calls == 0


def test_a_replan_over_budget_stops_the_run_unless_continuing(tmp_path):
    recipe = _recipe(tmp_path, **{"pilot.enabled": True})
    over = make_plan(recipe.model_copy(update={"budget": recipe.budget.model_copy(update={"max_days": 1e-9})}), FACTS)
    with pytest.raises(Stopped) as stop:
        run_recipe(_request(tmp_path, recipe), View(), pilot=Pilot(over))
    assert "breaks the budget" in stop.value.message and "[budget_days] budget.max_days" in stop.value.message
    assert not fakes.CALLS
    view = View()
    assert run_recipe(_request(tmp_path, recipe, continue_over_budget=True), view, pilot=Pilot(over)).ok
    assert any(s.startswith("over budget, continuing") for s in view.shown) and fakes.CALLS["export"] == 1


def test_a_replan_with_other_errors_stops_even_over_budget(tmp_path):
    recipe = _recipe(tmp_path, **{"pilot.enabled": True})
    truncated = recipe.model_copy(update={"dataset": recipe.dataset.model_copy(update={
        "stats": recipe.dataset.stats.model_copy(update={"output_tokens_mean": 15, "output_tokens_p90": 100})})})
    pilot = Pilot(make_plan(truncated, FACTS))
    with pytest.raises(Stopped) as stop:
        run_recipe(_request(tmp_path, recipe, continue_over_budget=True), View(), pilot=pilot)
    assert "the plan has errors" in stop.value.message
    assert [f.code for f in stop.value.findings] == ["generate_truncation"] and not fakes.CALLS


def test_the_retrain_hint_is_a_fifth_of_the_lr_when_training_runs(tmp_path):
    assert run_recipe(_request(tmp_path, _recipe(tmp_path)), View()).retrain_lr == pytest.approx(3e-3 / 5)
    off = _recipe(tmp_path, **{"stages.train": {"enabled": False}, "stages.eval": {"enabled": False},
                               "stages.export": {"enabled": False}})
    assert run_recipe(_request(tmp_path, off, run_dir=tmp_path / "other"), View()).retrain_lr is None


def test_pilot_recipe_stops_on_any_plan_error_even_over_budget(tmp_path):
    recipe = _recipe(tmp_path, **{"budget.max_days": 1e-9, "pilot.enabled": True})
    pilot = Pilot(make_plan(recipe, FACTS))
    with pytest.raises(Stopped, match="the plan has 1 error\\(s\\); no pilot was run"):
        pilot_recipe(_request(tmp_path, recipe, continue_over_budget=True), View(), pilot=pilot)
    assert pilot.calls == 0
