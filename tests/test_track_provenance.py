"""Provenance: git state in and out of a checkout, package versions, torch facts, redaction."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from dflashx.track import provenance
from dflashx.track.provenance import (
    environment_facts,
    git_state,
    package_versions,
    stage_provenance,
    torch_facts,
)
from dflashx.track.redact import REDACTED


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_git_state_outside_a_checkout(tmp_path):
    assert git_state(tmp_path) == {"commit": None, "dirty": None}


def test_git_state_clean_then_dirty(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "f.txt").write_text("a")
    _git(tmp_path, "add", "f.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    state = git_state(tmp_path)
    assert len(state["commit"]) == 40 and state["dirty"] is False
    (tmp_path / "f.txt").write_text("b")
    assert git_state(tmp_path)["dirty"] is True


def test_package_versions_match_importlib_metadata():
    versions = package_versions()
    assert versions["pydantic"] == importlib.metadata.version("pydantic")
    assert versions["torch"] == importlib.metadata.version("torch")


def test_torch_facts_on_this_machine():
    facts = torch_facts()
    import torch

    assert facts["torch"] == torch.__version__ and facts["cuda"] == torch.version.cuda
    assert facts["gpu_count"] == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


def test_torch_absent(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(provenance.importlib.util, "find_spec", lambda name: None)
    assert torch_facts() is None


def test_stage_provenance_is_complete_and_redacted(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "planted-secret-value-42")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    record = stage_provenance(
        stage="train", stage_key="k", argv=["dflashx", "run", "r.yaml", "--api-key", "zzz"],
        resolved={"name": "r", "storage": {"s3": {"bucket": "b"}}, "x": {"token": "t"}},
        started_at="2026-01-01T00:00:00+00:00", ended_at="2026-01-01T00:01:00+00:00", exit_state="done",
        inputs={"tokenize.dataset": "abc"}, outputs={"checkpoint": "def"},
        message="used planted-secret-value-42", estimates={"seconds": 3})
    for key in ("command_line", "resolved_recipe", "dflashx", "packages", "python", "hostname", "torch", "env",
                "started_at", "ended_at", "exit_state", "inputs", "outputs", "plan_estimates"):
        assert key in record, key
    assert record["command_line"][-1] == REDACTED
    assert record["env"]["AWS_SECRET_ACCESS_KEY"] == REDACTED and record["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert record["resolved_recipe"]["x"]["token"] == REDACTED
    assert record["message"] == f"used {REDACTED}"
    assert record["dflashx"]["version"] == environment_facts()["dflashx"]["version"]


@pytest.mark.gpu
def test_gpu_facts():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    facts = torch_facts()
    assert facts["cuda_available"] and facts["gpu_count"] == torch.cuda.device_count() >= 1
    assert all(name.strip() for name in facts["gpus"]) and facts["cuda"]
    assert facts["driver"] is None or facts["driver"][0].isdigit()
