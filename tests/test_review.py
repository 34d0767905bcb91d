"""`dflashx review BASE HEAD`: markdown for a recipe pull request (files and path@gitref)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dflashx.cli.main import app
from dflashx.report.review import split_spec

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _recipe(folder: Path, name: str = "a.yaml", **changes: object) -> Path:
    """recipes/tiny.yaml copied to `folder`, with dotted-key `changes` (e.g. stages__train__epochs=12)."""
    data = yaml.safe_load((REPO / "recipes/tiny.yaml").read_text())
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(yaml.safe_dump(data))
    return folder / name


def _review(base: str, head: str):
    return runner.invoke(app, ["review", base, head])


def test_review_shows_changed_keys_and_plan_diff(tmp_path: Path) -> None:
    base = _recipe(tmp_path / "base")
    head = _recipe(tmp_path / "head", stages__train__epochs=12)
    result = _review(str(base), str(head))
    assert result.exit_code == 0, result.output
    out = result.output
    assert "| `stages.train.epochs` | 10 | 12 |" in out
    assert out.count("| `") == 1  # only that key changed (paths compared relative to each recipe)
    time_row = next(line for line in out.splitlines() if line.startswith("| time |"))
    assert time_row.split("|")[4].strip().startswith("+")  # more epochs take longer
    train_row = next(line for line in out.splitlines() if line.startswith("| train |"))
    assert "→" in train_row
    assert "| ingest |" not in out  # unchanged stages are left out


def test_review_shows_the_p10_p90_ranges(tmp_path: Path) -> None:
    base = _recipe(tmp_path / "base")
    head = _recipe(tmp_path / "head", dataset__stats__output_tokens_mean=104)  # twice the tiny corpus' mean
    out = _review(str(base), str(head)).output
    row = next(line for line in out.splitlines() if line.startswith("| time P10 – P90 |"))
    base_range, head_range, change = (c.strip() for c in row.split("|")[2:5])
    assert " – " in base_range and " – " in head_range and base_range != head_range
    assert change.startswith("P90 +")
    assert any(line.startswith("| USD P10 – P90 |") for line in out.splitlines())


def test_new_plan_error_is_reported_and_fails(tmp_path: Path) -> None:
    base = _recipe(tmp_path / "base")
    head = _recipe(tmp_path / "head", budget__max_days=1e-9)
    result = _review(str(base), str(head))
    assert result.exit_code == 1
    assert "### New errors" in result.output and "`budget_days` at `budget.max_days`" in result.output
    assert "Fix:" in result.output and "refuses it" in result.output
    back = _review(str(head), str(base))
    assert back.exit_code == 0 and "### Resolved errors" in back.output


def test_head_that_does_not_load_is_shown(tmp_path: Path) -> None:
    base = _recipe(tmp_path / "base")
    head = _recipe(tmp_path / "head", stages__train__lrr=0.1)
    result = _review(str(base), str(head))
    assert result.exit_code == 1
    assert "The head recipe does not load" in result.output and "stages.train.lrr" in result.output


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


def test_git_ref_form_follows_extends_at_that_commit(tmp_path: Path) -> None:
    recipes = tmp_path / "repo" / "recipes"
    _recipe(recipes, "base.yaml")
    (recipes / "child.yaml").write_text("extends: base.yaml\nname: child\n")
    _git(tmp_path / "repo", "init", "-q")
    _git(tmp_path / "repo", "add", ".")
    _git(tmp_path / "repo", "commit", "-q", "-m", "recipes")
    _recipe(recipes, "base.yaml", stages__train__lr=0.01)  # the working tree changes the base only
    result = _review(f"{recipes / 'child.yaml'}@HEAD", str(recipes / "child.yaml"))
    assert result.exit_code == 0, result.output
    assert "| `stages.train.lr` | 0.005 | 0.01 |" in result.output
    new = _review(f"{recipes / 'new.yaml'}@HEAD", str(recipes / "child.yaml"))
    assert new.exit_code == 0 and "New recipe" in new.output
    bad = _review(f"{recipes / 'child.yaml'}@no-such-ref", str(recipes / "child.yaml"))
    assert "is not a commit" in bad.output


@pytest.mark.parametrize("spec, expected", [
    ("recipes/a.yaml@main", (Path("recipes/a.yaml"), "main")),
    ("recipes/a.yaml@origin/main~1", (Path("recipes/a.yaml"), "origin/main~1")),
    ("recipes/a.yaml", (Path("recipes/a.yaml"), None)),
])
def test_split_spec(spec: str, expected: tuple[Path, str | None]) -> None:
    assert split_spec(spec) == expected
