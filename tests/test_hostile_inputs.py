"""Hostile recipe files: non-UTF-8 bytes, alias bombs and recursive aliases, deep nesting, and
non-finite numbers are refused as RecipeErrors (file, line, key) quickly, never as a traceback or
a hang; ordinary anchors and aliases still load."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dflashx.cli.main import app
from dflashx.config.errors import RecipeError
from dflashx.config.load import load_profile, load_recipe
from dflashx.config.schema import HardwareProfile, Recipe

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "recipes" / "tiny.yaml"
runner = CliRunner()


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DFLASHX_PROFILES_DIR", raising=False)
    monkeypatch.setenv("COLUMNS", "200")


def _child(tmp_path: Path, body: str, name: str = "r.yaml") -> Path:
    """A recipe that extends recipes/tiny.yaml with `body` (YAML text) on top."""
    path = tmp_path / name
    path.write_text(f"extends: {TINY}\n{body}")
    return path


def _problems(path: Path, overrides: tuple[str, ...] = ()) -> RecipeError:
    with pytest.raises(RecipeError) as info:
        load_recipe(path, overrides)
    return info.value


# --------------------------------------------------------------------------- non-UTF-8 bytes


def test_non_utf8_recipe_names_file_line_and_byte_offset(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"name: x\ntarget: {model: caf\xe9}\n")  # Latin-1 e-acute
    err = _problems(bad)
    [p] = err.problems
    assert p.origin is not None and p.origin.file == str(bad) and (p.origin.line, p.origin.column) == (2, 20)
    assert "not UTF-8" in p.message and "byte offset 27" in p.message and "0xe9" in p.message
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "latin1.yaml:2:20" in result.stderr and "byte offset 27" in result.stderr
    assert not isinstance(result.exception, UnicodeDecodeError)


def test_non_utf8_base_recipe_is_named(tmp_path: Path) -> None:
    base = tmp_path / "base.yaml"
    base.write_bytes(b"# \xff\xfe not text\nname: base\n")
    child = tmp_path / "child.yaml"
    child.write_text("extends: base.yaml\nname: child\n")
    [p] = _problems(child).problems
    assert p.origin is not None and p.origin.file == str(base) and p.origin.line == 1
    assert "byte offset 2" in p.message


def test_non_utf8_profile_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "odd.yaml").write_bytes(b"name: odd\ngpu: null\ngpus_per_node: 0\n# \xc3\x28\n")
    monkeypatch.setenv("DFLASHX_PROFILES_DIR", str(profiles))
    for load in (lambda: load_recipe(TINY, ["hardware=odd"]), lambda: load_profile("odd")):
        with pytest.raises(RecipeError) as info:
            load()
        [p] = info.value.problems
        assert p.origin is not None and p.origin.file == str(profiles / "odd.yaml") and p.origin.line == 4
        assert "not UTF-8" in p.message and "byte offset 39" in p.message


# --------------------------------------------------------------------------- aliases and nesting


def _laughs(levels: int, width: int = 10) -> str:
    """The "billion laughs" document: each anchor is a list of `width` aliases of the one before."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\nname: bomb\n"


@pytest.mark.timeout(20)
def test_alias_bomb_is_refused_in_under_a_second(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_laughs(10))  # 10**10 values once expanded
    start = time.perf_counter()
    err = _problems(bomb)
    assert time.perf_counter() - start < 1.0
    [p] = err.problems
    assert "alias bomb" in p.message and p.origin is not None and p.origin.file == str(bomb)
    start = time.perf_counter()
    result = runner.invoke(app, ["plan", str(bomb), "--json"])
    assert time.perf_counter() - start < 1.0
    assert result.exit_code == 2 and "alias bomb" in result.stdout


@pytest.mark.timeout(20)
def test_alias_bomb_in_a_base_recipe_is_refused(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(_laughs(9))
    child = tmp_path / "child.yaml"
    child.write_text("extends: base.yaml\nname: child\n")
    start = time.perf_counter()
    [p] = _problems(child).problems
    assert time.perf_counter() - start < 1.0
    assert "alias bomb" in p.message and p.origin is not None and p.origin.file == str(tmp_path / "base.yaml")


@pytest.mark.timeout(20)
def test_recursive_alias_is_refused(tmp_path: Path) -> None:
    loop = tmp_path / "loop.yaml"
    loop.write_text("name: x\nloop: &a [1, *a]\n")
    [p] = _problems(loop).problems
    assert "recursive alias" in p.message and p.origin is not None and p.origin.line == 2


@pytest.mark.timeout(20)
def test_deep_nesting_is_refused(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: x\nz: " + "[" * 5000 + "]" * 5000 + "\n")
    [p] = _problems(deep).problems  # whatever the installed PyYAML's own limit (test_yaml_releases.py)
    assert p.message == "the YAML is nested more than 64 levels deep" and p.origin is not None
    assert (p.origin.file, p.origin.line) == (str(deep), 2) and "fewer nested" in p.fix
    result = runner.invoke(app, ["validate", str(deep)])
    assert result.exit_code == 2 and not isinstance(result.exception, RecursionError)


def test_ordinary_anchors_and_aliases_still_load(tmp_path: Path) -> None:
    recipe = _child(tmp_path, (
        "stages:\n"
        "  generate: {temperature: &t 0.0, max_tokens: &n 96}\n"
        "  eval: {max_new_tokens: *n}\n"
        "  train: {lr: &lr 2.0e-3}\n"
        "deploy: {temperature: *t}\n"
        "tracking: {project: &p anchored, entity: *p}\n"
    ))
    r = load_recipe(recipe).recipe
    assert (r.stages.generate.max_tokens, r.stages.eval.max_new_tokens) == (96, 96)
    assert r.deploy.temperature == 0.0 and r.stages.train.lr == 2.0e-3
    assert r.tracking.project == r.tracking.entity == "anchored"


# --------------------------------------------------------------------------- non-finite numbers


@pytest.mark.parametrize("text", ["1e309", ".inf", "-.inf", ".nan"])
def test_non_finite_float_in_a_file_names_key_and_line(tmp_path: Path, text: str) -> None:
    recipe = _child(tmp_path, f"budget:\n  max_usd: 100\nstages:\n  train:\n    lr: {text}\n")
    [p] = _problems(recipe).problems
    assert p.key == "stages.train.lr" and p.origin is not None and (p.origin.file, p.origin.line) == (str(recipe), 6)
    assert "finite" in (p.expected or "") and "finite" in p.fix


@pytest.mark.parametrize("override", ["budget.max_usd=1e309", "hardware.usd_per_gpu_hour=.inf",
                                      "dataset.stats.output_tokens_mean=.inf", "hardware.calibrated.mfu=.nan"])
def test_non_finite_float_in_an_override_names_the_key(override: str) -> None:
    [p] = _problems(TINY, (override,)).problems
    assert p.key == override.split("=")[0] and "finite" in (p.expected or "")
    assert p.origin is not None and override in str(p.origin)


def _float_schemas(node: Any) -> list[dict[str, Any]]:
    """Every `float` validator in a pydantic core schema (definitions included)."""
    if isinstance(node, dict):
        found = [node] if node.get("type") == "float" else []
        return found + [f for v in node.values() for f in _float_schemas(v)]
    if isinstance(node, list):
        return [f for v in node for f in _float_schemas(v)]
    return []


@pytest.mark.parametrize("model", [Recipe, HardwareProfile])
def test_every_float_field_of_the_schema_is_finite(model: type) -> None:
    model.model_rebuild()  # the models build on first use (defer_build): build it whichever test ran first
    floats = _float_schemas(model.__pydantic_core_schema__)
    assert len(floats) >= 10
    infinite = [f for f in floats if f.get("allow_inf_nan") is not False]
    assert not infinite, infinite
