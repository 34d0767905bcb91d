"""`dflashx calibrate`: factors fitted from run records, written where the recipe loader reads them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dflashx.cli._common import target_facts
from dflashx.cli.main import app
from dflashx.config.load import load_recipe
from dflashx.plan.plan import make_plan
from dflashx.run.keys import stage_key
from dflashx.run.rundir import RunDir
from dflashx.store.manifest import Manifest, atomic_write_json
from dflashx.track.records import RecordLog

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.fixture
def profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the cpu profile, searched first, so --write never touches the repository."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    shutil.copy(REPO / "dflashx/hardware_profiles/cpu.yaml", folder / "cpu.yaml")
    monkeypatch.setenv("DFLASHX_PROFILES_DIR", str(folder))
    return folder


def _planned_tps() -> tuple[float, float]:
    """The tiny recipe's planned generate tokens/s and the calibration ratio the plan applied."""
    recipe = load_recipe(REPO / "recipes/tiny.yaml").recipe
    terms = {t["key"]: t for t in make_plan(recipe, target_facts(recipe)).to_json(explain=True)["explain"]}
    t = terms["generate.tokens_per_second"]
    return t["value"], t["inputs"]["calibration"]


def _run(root: Path, name: str, tokens_per_s: float | None, mfu: float | None) -> Path:
    """A run folder of recipes/tiny.yaml whose generate/train stages measured the given figures."""
    recipe = load_recipe(REPO / "recipes/tiny.yaml").recipe
    run = root / name
    run.mkdir(parents=True)
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe.model_dump(mode="json")))
    made = make_plan(recipe, target_facts(recipe))
    plan = made.to_json()
    atomic_write_json(run / "plan.json", plan)
    log = RecordLog(run, f"{name}-1")
    for stage, metrics in (("generate", {"output_tokens_per_s": tokens_per_s}), ("train", {"mfu": mfu})):
        if None not in metrics.values():
            log.append("stage_end", stage=stage, duration_s=10.0, metrics=metrics)
            RunDir(run).mark_success(stage, stage_key(stage, made.resolved, Manifest.load(run)).key, 10.0)
    return run


def test_fits_median_per_profile_and_writes_what_the_loader_merges(tmp_path: Path, profiles: Path) -> None:
    planned, used = _planned_tps()
    runs = [_run(tmp_path, "r1", planned * 0.5, 0.04), _run(tmp_path, "r2", planned * 0.7, 0.06),
            _run(tmp_path, "r3", planned * 0.6, None)]
    dry = runner.invoke(app, ["calibrate", *map(str, runs)], env={"COLUMNS": "200"})
    assert dry.exit_code == 0, dry.output
    assert "add --write" in dry.output and not (profiles / "cpu.calibration.yaml").exists()
    assert "r3: no measured training MFU" in dry.output

    result = runner.invoke(app, ["calibrate", *map(str, runs), "--write"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    written = yaml.safe_load((profiles / "cpu.calibration.yaml").read_text())
    assert written["calibrated"]["serving_ratio"] == pytest.approx(used * 0.6, rel=1e-3)
    assert written["calibrated"]["training_mfu"] == pytest.approx(0.05)

    hardware = load_recipe(REPO / "recipes/tiny.yaml").recipe.hardware
    assert hardware.calibrated == written["calibrated"]
    replanned, now_used = _planned_tps()
    assert now_used == pytest.approx(used * 0.6, rel=1e-3)
    assert replanned == pytest.approx(planned * 0.6, rel=1e-3)  # the calibrated plan predicts the runs


def test_write_keeps_other_factors_and_clips_to_one(tmp_path: Path, profiles: Path) -> None:
    (profiles / "cpu.calibration.yaml").write_text("calibrated: {other_factor: 0.3}\n")
    planned, _ = _planned_tps()
    run = _run(tmp_path, "fast", planned * 1000, None)
    assert runner.invoke(app, ["calibrate", str(run), "--write"]).exit_code == 0
    written = yaml.safe_load((profiles / "cpu.calibration.yaml").read_text())["calibrated"]
    assert written == {"other_factor": 0.3, "serving_ratio": 1.0}


def test_nothing_measured_exits_1(tmp_path: Path, profiles: Path) -> None:
    result = runner.invoke(app, ["calibrate", str(_run(tmp_path, "empty", None, None))])
    assert result.exit_code == 1 and "nothing to calibrate" in result.output


def test_not_a_run_dir_exits_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["calibrate", str(tmp_path)])
    assert result.exit_code == 2 and "no plan.json" in result.output
