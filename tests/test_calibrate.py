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
from dflashx.plan.calibration import predicted, predicted_tokens_per_s
from dflashx.plan.estimates.device import CALIBRATED_MFU, CALIBRATED_SERVING
from dflashx.plan.estimates.lengths import scaled_stats
from dflashx.plan.plan import make_plan
from dflashx.report.calibrate import calibrate
from dflashx.report.runinfo import RunInfo
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


def _model_tps(output_mean: float, written: int) -> float:
    """The serving model's tokens/s for the tiny recipe at these measured lengths (no calibration)."""
    recipe = load_recipe(REPO / "recipes/tiny.yaml").recipe
    stats = scaled_stats(recipe.dataset.stats, output_mean / recipe.dataset.stats.output_tokens_mean).model_dump()
    return predicted_tokens_per_s(predicted(recipe, target_facts(recipe), stats | {"samples": written,
                                                                                  "prompt_tokens_mean": 30.0}))


GEN = {"output_tokens_mean": 60.0, "prompt_tokens_mean": 30.0, "completions_written": 200}


def _run(root: Path, name: str, tokens_per_s: float | None, mfu: float | None) -> Path:
    """A run folder of recipes/tiny.yaml whose generate/train stages measured the given figures."""
    recipe = load_recipe(REPO / "recipes/tiny.yaml").recipe
    run = root / name
    run.mkdir(parents=True)
    made = make_plan(recipe, target_facts(recipe))
    (run / "recipe.yaml").write_text(yaml.safe_dump(made.resolved.model_dump(mode="json")))  # as `dflashx run` saves it
    atomic_write_json(run / "plan.json", made.to_json())
    log = RecordLog(run, f"{name}-1")
    for stage, metrics in (("generate", {"output_tokens_per_s": tokens_per_s, **GEN}), ("train", {"mfu": mfu})):
        if None not in metrics.values():
            log.append("stage_end", stage=stage, duration_s=10.0, metrics=metrics)
            RunDir(run).mark_success(stage, stage_key(stage, made.resolved, Manifest.load(run)).key, 10.0)
    return run


def test_fits_median_per_profile_and_writes_what_the_loader_merges(tmp_path: Path, profiles: Path) -> None:
    model = _model_tps(GEN["output_tokens_mean"], GEN["completions_written"])
    runs = [_run(tmp_path, "r1", model * 0.5, 0.04), _run(tmp_path, "r2", model * 0.7, 0.06),
            _run(tmp_path, "r3", model * 0.6, None)]
    dry = runner.invoke(app, ["calibrate", *map(str, runs)], env={"COLUMNS": "200"})
    assert dry.exit_code == 0, dry.output
    assert "add --write" in dry.output and not (profiles / "cpu.calibration.yaml").exists()
    assert "r3: no measured training MFU" in dry.output

    result = runner.invoke(app, ["calibrate", *map(str, runs), "--write"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    written = yaml.safe_load((profiles / "cpu.calibration.yaml").read_text())
    assert written["calibrated"][CALIBRATED_SERVING] == pytest.approx(0.6, rel=1e-3)
    assert written["calibrated"][CALIBRATED_MFU] == pytest.approx(0.05)
    hardware = load_recipe(REPO / "recipes/tiny.yaml").recipe.hardware
    assert hardware.calibrated == written["calibrated"]


def test_the_ratio_is_against_the_model_not_an_earlier_calibration(tmp_path: Path, profiles: Path) -> None:
    model = _model_tps(GEN["output_tokens_mean"], GEN["completions_written"])
    (profiles / "cpu.calibration.yaml").write_text(f"calibrated: {{{CALIBRATED_SERVING}: 0.25}}\n")
    run = _run(tmp_path, "calibrated", model * 0.8, None)  # planned with the earlier ratio in place
    fit = calibrate([RunInfo.load(run)], target_facts).fits[0]
    assert (fit.factor, fit.planned, fit.fitted) == (CALIBRATED_SERVING, pytest.approx(model), pytest.approx(0.8))


def test_write_keeps_other_factors(tmp_path: Path, profiles: Path) -> None:
    (profiles / "cpu.calibration.yaml").write_text("calibrated: {other_factor: 0.3}\n")
    run = _run(tmp_path, "fast", None, 0.5)
    assert runner.invoke(app, ["calibrate", str(run), "--write"]).exit_code == 0
    written = yaml.safe_load((profiles / "cpu.calibration.yaml").read_text())["calibrated"]
    assert written == {"other_factor": 0.3, CALIBRATED_MFU: 0.5}


def test_nothing_measured_exits_1(tmp_path: Path, profiles: Path) -> None:
    result = runner.invoke(app, ["calibrate", str(_run(tmp_path, "empty", None, None))])
    assert result.exit_code == 1 and "nothing to calibrate" in result.output


def test_not_a_run_dir_exits_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["calibrate", str(tmp_path)])
    assert result.exit_code == 2 and "no plan.json" in result.output
