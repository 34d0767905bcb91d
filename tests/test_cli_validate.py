"""`dflashx validate`, `dflashx schema`, `dflashx profiles` through the real typer app."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dflashx.cli.main import app

REPO = Path(__file__).resolve().parents[1]
BAD = REPO / "tests" / "fixtures" / "bad_recipes"
runner = CliRunner()


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("DFLASHX_PROFILES_DIR", raising=False)
    monkeypatch.setenv("COLUMNS", "200")


def test_validate_ok_prints_summary() -> None:
    result = runner.invoke(app, ["validate", "recipes/tiny.yaml", "train.mode=online"])
    assert result.exit_code == 0, result.output
    assert "recipe recipes/tiny.yaml: tiny" in result.stdout
    assert "hardware  cpu" in result.stdout
    last = result.stdout.rstrip().splitlines()[-1]
    assert last in ("OK", "schema OK (planner rules skipped: dflashx.plan is not available)")


def test_validate_shows_overrides_in_summary() -> None:
    result = runner.invoke(app, ["validate", "recipes/tiny.yaml", "hardware=h200_x1", "train.mode=offline"])
    assert "hardware  h200_x1 (1x H200)" in result.stdout
    assert "train     offline" in result.stdout


def test_validate_bad_recipe_exits_2_without_traceback() -> None:
    env = {**os.environ, "DFLASHX_PROFILES_DIR": str(BAD / "profiles")}
    proc = subprocess.run(
        [sys.executable, "-m", "dflashx.cli.main", "validate", str(BAD / "many_errors.yaml"), "trian.lr=1"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "(6 problems)" in proc.stderr
    assert "tests/fixtures/bad_recipes/many_errors.yaml:10: tracking.mode" in proc.stderr
    assert "did you mean 'tracking' or 'stages.train'?" in proc.stderr
    assert proc.stdout == ""


def test_validate_missing_file_exits_2() -> None:
    result = runner.invoke(app, ["validate", "recipes/tinny.yaml"])
    assert result.exit_code == 2
    assert "did you mean 'tiny.yaml' or 'tiny_moe.yaml'?" in result.stderr


def test_validate_plan_errors_exit_1() -> None:
    result = runner.invoke(app, ["validate", "recipes/qwen36_27b.yaml", "stages.generate.serving.tp=3"])
    assert result.exit_code == 1, result.output
    assert "stages.generate.serving" in result.stdout
    assert "FAILED" in result.stdout


def test_schema_to_stdout_and_file(tmp_path: Path) -> None:
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert schema["additionalProperties"] is False
    assert {"type": "string", "description": "Profile name"} in schema["properties"]["hardware"]["anyOf"]
    assert "extends" in schema["properties"]
    out = tmp_path / "sub" / "recipe.schema.json"
    result = runner.invoke(app, ["schema", "--out", str(out)])
    assert result.exit_code == 0
    assert json.loads(out.read_text()) == schema
    assert [p.name for p in out.parent.iterdir()] == ["recipe.schema.json"]  # no temp file left


def test_profiles_lists_repository_profiles() -> None:
    result = runner.invoke(app, ["profiles"])
    assert result.exit_code == 0, result.output
    for name in ("rtx_pro_6000_x4", "b200_nvl8", "h200_x1", "h200_x8", "h100_x8", "cpu"):
        assert name in result.stdout
    assert "BF16 TFLOP/s" in result.stdout


def test_profiles_reports_a_broken_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASHX_PROFILES_DIR", str(BAD / "profiles"))
    result = runner.invoke(app, ["profiles"])
    assert result.exit_code == 2
    assert "gpu4" in result.stdout and "TestGPU" in result.stdout
    assert "broken_profile.yaml:6: host_memory_gbb: unknown key" in result.stderr


def test_cli_never_imports_heavy_packages() -> None:
    script = textwrap.dedent("""
        import sys
        from typer.testing import CliRunner
        from dflashx.cli.main import app
        runner = CliRunner()
        codes = [runner.invoke(app, args).exit_code for args in (
            ["--help"], ["validate", "recipes/tiny.yaml"], ["validate", "recipes/qwen36_27b.yaml"],
            ["schema"], ["profiles"], ["plan", "recipes/qwen36_27b.yaml", "--dry-run"])]
        heavy = sorted(m for m in ("torch", "transformers", "deepspeed") if m in sys.modules)
        print(codes, heavy)
        assert not heavy, heavy
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
