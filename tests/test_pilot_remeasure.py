"""Each pilot attempt measures under its own conditions: a pilot killed between its generation and its save
resumes with the serving figures the generation measured (its record in the run's records.jsonl: pilot/plan.json is
the attempt, no resume file of its own), a second pilot under changed
operational values generates `pilot.prompts` more completions and re-runs its training (the stage keys leave
those values out), and the run's recipe.yaml stays the user's recipe, not the pilot's smaller one. The plan's
budget errors do not stop a pilot (the session decides on them); any other error is named. The round-trip
gate's failures stop the pilot with a message, not a traceback."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from _plan_recipes import seeds_recipe
from openai_server import Script, ScriptedOpenAIServer, last_user
from test_pilot import PILOT, invoke, tiny_file

from dflashx.config.load import load_recipe
from dflashx.plan.calibration import PilotCalibration, conditions
from dflashx.plan.findings import error
from dflashx.plan.plan import make_plan
from dflashx.run.layout import calibration_path
from dflashx.run.observer import SilentObserver
from dflashx.run.pilot import Pilot, PilotFailed
from dflashx.run.pilot_compare import generation
from dflashx.store.manifest import Manifest
from dflashx.targets.facts import facts_for


def _train_events(run_dir: Path) -> int:
    rows = map(json.loads, (run_dir / "pilot" / "records.jsonl").read_text().splitlines())
    return sum(r["event"] == "stage_end" and r["stage"] == "train" for r in rows)


@pytest.mark.slow  # real stages on the tiny recipe
@pytest.mark.timeout(400)
def test_each_pilot_attempt_measures_under_its_own_conditions(tmp_path, monkeypatch):
    run_dir = tmp_path / "runs" / "tiny"
    with ScriptedOpenAIServer(Script()) as server:
        recipe = tiny_file(tmp_path, stages__generate__backend="sglang", stages__generate__urls=[server.url],
                           pilot__roundtrip=False)
        args = ("pilot", str(recipe), "--skip-preflight", "--continue-over-budget")

        with monkeypatch.context() as m:  # killed after its generation, before its training and save
            m.setattr(Pilot, "_train", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
            killed = invoke(*args)
        assert killed.exit_code == 130, killed.output
        assert len(server.requests) == PILOT and not calibration_path(run_dir).exists()

        resumed = invoke(*args)
        assert resumed.exit_code == 0, resumed.output
        assert len(server.requests) == PILOT  # nothing asked again: the killed attempt's figures are read back
        first = PilotCalibration.model_validate_json(calibration_path(run_dir).read_bytes())
        assert first.serving_ratio and first.serving_ratio > 0
        assert first.measured["generation"]["completions"] == PILOT and first.training_mfu
        assert _train_events(run_dir) == 1 and not (run_dir / "pilot" / "attempt.json").exists()
        recorded = generation(run_dir / "records.jsonl")  # what the killed attempt's generation measured
        assert recorded and first.measured["generation"]["measured_tokens_per_s"] == recorded["output_tokens_per_s"]

        again = invoke(*args, "stages.train.micro_batch=2")  # operational: in no stage key, in the conditions
        assert again.exit_code == 0, again.output
    asked = Counter(last_user(body["messages"]) for body in server.requests)
    assert len(asked) == 2 * PILOT and set(asked.values()) == {1}  # pilot.prompts more, none twice
    second = PilotCalibration.model_validate_json(calibration_path(run_dir).read_bytes())
    user = load_recipe(recipe, ["stages.train.micro_batch=2"]).recipe
    assert second.conditions == conditions(user) != first.conditions
    assert second.serving_ratio and second.measured["generation"]["completions"] == PILOT
    assert second.measured_at != first.measured_at and second.training_mfu
    assert _train_events(run_dir) == 2  # the training re-ran: its figures are this attempt's
    assert list((run_dir / "pilot").glob("train.superseded-*"))
    deleted = [e for e in Manifest.load(run_dir / "pilot").entries.values()
               if e.stage == "train" and not (run_dir / "pilot" / e.path).exists()]
    assert deleted and all(e.tier == "garbage" for e in deleted)  # the states the pilot deleted
    saved = yaml.safe_load((run_dir / "recipe.yaml").read_text())  # the user's recipe, not the pilot's
    assert saved["stages"]["generate"]["max_prompts"] is None and saved["stages"]["generate"]["max_minutes"] is None
    assert saved["stages"]["train"]["max_steps"] != 6


def test_budget_errors_do_not_stop_a_pilot_and_other_errors_are_named(tmp_path):
    recipe = seeds_recipe(budget__max_usd=1)
    plan = make_plan(recipe, facts_for(recipe.target))
    assert [f.code for f in plan.errors] == ["budget_usd"]
    with open(tmp_path / ".lock", "a+") as held:
        Pilot(recipe, plan, tmp_path, SilentObserver(), held)  # --continue-over-budget: the session decides
        broken = dataclasses.replace(plan, findings=(error("x_code", "stages.x", "broken", "fix"), *plan.findings))
        with pytest.raises(PilotFailed, match=r"1 error\(s\) \(\[x_code\] stages\.x\)"):
            Pilot(recipe, broken, tmp_path, SilentObserver(), held)


@pytest.mark.slow  # loads the tiny target
@pytest.mark.timeout(300)
def test_a_roundtrip_gate_without_a_usable_prompt_stops_with_a_message(tmp_path):
    source = tmp_path / "broken.jsonl"
    source.write_text("".join(json.dumps({"text": f"no messages {i}"}) + "\n" for i in range(8)))
    recipe = tiny_file(tmp_path, dataset__sources=[{"name": "broken", "path": str(source), "format": "messages"}],
                       pilot__roundtrip=True)
    stopped = invoke("pilot", str(recipe), "--skip-preflight", "--continue-over-budget")
    assert stopped.exit_code == 1, stopped.output
    assert "roundtrip gate: dataset.sources: no prompt could be read" in stopped.output
    assert "pilot.roundtrip: false skips the gate" in stopped.output and "error.log" in stopped.output
    assert "Traceback" not in stopped.output and isinstance(stopped.exception, SystemExit)  # a clean exit
