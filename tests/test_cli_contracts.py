"""CLI contracts: `plan --json` is always one JSON object, `review` refuses a ref that does not
exist, `validate` keeps its findings on one stream, and an override written as an option
(`--hardware b200_nvl8`) is answered with the override to write."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dflashx.cli.main import app

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "recipes" / "tiny.yaml")
SEEDS = str(REPO / "recipes" / "qwen36_27b.yaml")
runner = CliRunner()


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DFLASHX_PROFILES_DIR", raising=False)
    monkeypatch.setenv("COLUMNS", "200")  # rich error panels on one line


def _one_json_object(stdout: str) -> dict:
    data, end = json.JSONDecoder().raw_decode(stdout)
    assert stdout[end:].strip() == "", "more than one JSON object on stdout"
    assert isinstance(data, dict)
    return data


# --------------------------------------------------------------------------- plan --json


def _broken_target(tmp_path: Path) -> list[str]:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    return [TINY, f"target.model={tmp_path / 'broken'}"]


def _latin1(tmp_path: Path) -> list[str]:
    (tmp_path / "l1.yaml").write_bytes(b"name: \xe9\n")
    return [str(tmp_path / "l1.yaml")]


CASES = {
    "missing file": lambda tmp: [str(tmp / "nope.yaml")],
    "unknown key": lambda tmp: [TINY, "stages.train.lrr=1"],
    "not UTF-8": _latin1,
    "bad override": lambda tmp: [TINY, "train.lr"],
    "broken config.json": _broken_target,
}


@pytest.mark.parametrize("case", list(CASES))
def test_plan_json_on_a_recipe_that_cannot_be_planned_is_one_object(tmp_path: Path, case: str) -> None:
    result = runner.invoke(app, ["plan", *CASES[case](tmp_path), "--json"])
    assert result.exit_code == 2, result.output
    data = _one_json_object(result.stdout)
    assert list(data) == ["errors", "warnings", "stages", "totals", "ranges", "calibration", "resolved", "deploy"]
    assert data["errors"] and data["warnings"] == [] and data["stages"] == []
    assert data["resolved"] is None is data["deploy"]
    for e in data["errors"]:
        assert {"code", "severity", "key", "message", "fix", "file", "line"} <= set(e)
        assert e["severity"] == "error" and e["message"]


def test_plan_json_error_carries_file_line_key_and_fix(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", TINY, "stages.train.lrr=1", "--json"])
    [e] = _one_json_object(result.stdout)["errors"]
    assert e["key"] == "stages.train.lrr" and e["message"] == "unknown key" and "lr" in e["fix"]
    assert e["file"] == "override 'stages.train.lrr=1'"
    result = runner.invoke(app, ["plan", str(REPO / "tests/fixtures/bad_recipes/many_errors.yaml"), "--json"])
    errors = _one_json_object(result.stdout)["errors"]
    assert any(e["key"] == "tracking.mode" and e["line"] == 10 and e["file"].endswith("many_errors.yaml")
               for e in errors)


def test_plan_json_of_a_good_recipe_keeps_its_shape() -> None:
    result = runner.invoke(app, ["plan", TINY, "--json"])
    assert result.exit_code == 0, result.output
    data = _one_json_object(result.stdout)
    assert list(data) == ["errors", "warnings", "stages", "totals", "ranges", "calibration", "resolved", "deploy"]
    assert data["resolved"] and data["deploy"]["profile"] == "cpu"


# --------------------------------------------------------------------------- validate


def test_validate_prints_warnings_and_errors_on_one_stream() -> None:
    result = runner.invoke(app, ["validate", SEEDS, "stages.generate.serving.tp=3"])
    assert result.exit_code == 1
    assert "stages.generate.serving" in result.stdout and "FAILED" in result.stdout
    assert result.stderr == ""


# --------------------------------------------------------------------------- review


def _repo_with_recipe(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "recipes").mkdir(parents=True)
    shutil.copy(TINY, repo / "recipes" / "a.yaml")
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "a"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                       capture_output=True)
    return repo / "recipes" / "a.yaml"


def test_review_of_a_ref_that_does_not_exist_exits_2(tmp_path: Path) -> None:
    recipe = _repo_with_recipe(tmp_path)
    for args in ([f"{recipe}@nosuchref", str(recipe)], [str(recipe), f"{recipe}@nosuchref"]):
        result = runner.invoke(app, ["review", *args])
        assert result.exit_code == 2, result.output
        assert "'nosuchref' is not a commit" in result.stderr and "Changed keys" not in result.stdout


def test_review_of_a_path_missing_at_a_valid_ref_is_a_new_recipe(tmp_path: Path) -> None:
    recipe = _repo_with_recipe(tmp_path)
    result = runner.invoke(app, ["review", f"{recipe.with_name('new.yaml')}@HEAD", str(recipe)])
    assert result.exit_code == 0, result.output
    assert "New recipe" in result.stdout


def test_review_of_a_ref_outside_a_git_repository_exits_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["review", f"{tmp_path / 'gone' / 'a.yaml'}@HEAD", TINY])
    assert result.exit_code == 2 and "not in a git repository" in result.stderr


# --------------------------------------------------------------------------- options that are overrides


@pytest.mark.parametrize("command", ["plan", "validate", "run"])
@pytest.mark.parametrize(("args", "override"), [
    (["--hardware", "b200_nvl8"], "hardware=b200_nvl8"),
    (["--hardware=b200_nvl8"], "hardware=b200_nvl8"),
    (["--train.lr", "1e-4"], "train.lr=1e-4"),
    (["--stages.train.lr"], "stages.train.lr=VALUE"),
])
def test_an_override_written_as_an_option_gets_a_hint(command: str, args: list[str], override: str) -> None:
    result = runner.invoke(app, [command, TINY, *args])
    assert result.exit_code == 2
    assert f"no option {args[0].split('=')[0]}: did you mean `{override}` (an override)?" in result.output


def test_other_unknown_options_keep_the_usual_message() -> None:
    result = runner.invoke(app, ["plan", TINY, "--jsn"])
    assert result.exit_code == 2 and "--json" in result.output and "an override" not in result.output
    result = runner.invoke(app, ["status", "--hardware", "x"])  # takes no overrides
    assert result.exit_code == 2 and "an override" not in result.output
