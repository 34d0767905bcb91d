"""`dflashx backup` and the backup stage against a real S3 server (SeaweedFS), path-style."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from s3_fixtures import S3Server, make_run
from typer.testing import CliRunner

from dflashx.cli.main import app
from dflashx.config.schema import Recipe, S3Spec
from dflashx.stages.backup import run as backup_stage
from dflashx.stages.base import StageContext, StageFailed
from helpers_models import stage_context
from dflashx.store.manifest import Manifest

pytestmark = pytest.mark.s3
runner = CliRunner()


def test_backup_to_s3_is_safe_then_corruption_is_caught(s3_spec: S3Spec, s3_env: S3Server,
                                                        tmp_path: Path) -> None:
    run = make_run(tmp_path, s3_spec)
    result = runner.invoke(app, ["backup", str(run)])
    assert result.exit_code == 0, result.output
    assert "safe to shut down" in result.output
    client = s3_env.client()
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=s3_spec.bucket)["Contents"]}
    assert "runs/tinyrun/train/checkpoint/model.safetensors" in keys
    assert not any("superseded" in k for k in keys)  # garbage is not copied
    remote = Manifest.load(run).entries["ingest.prompts"].remote
    assert remote.uri == f"s3://{s3_spec.bucket}/runs/tinyrun/ingest/prompts"

    key = "runs/tinyrun/ingest/prompts/shard-0.jsonl"
    head = client.head_object(Bucket=s3_spec.bucket, Key=key)
    client.put_object(Bucket=s3_spec.bucket, Key=key, Body=b"x" * head["ContentLength"],
                      Metadata=head["Metadata"])
    again = runner.invoke(app, ["backup", str(run)])
    assert again.exit_code == 1
    assert "safe to shut down" not in again.output
    assert "ingest/prompts/shard-0.jsonl" in again.output and "mismatch" in again.output


def test_backup_with_wrong_credentials_exits_1_with_clear_message(
        s3_spec: S3Spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(tmp_path, s3_spec)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-value")
    result = runner.invoke(app, ["backup", str(run)])
    assert result.exit_code == 1
    assert f"S3 rejected the credentials for endpoint {s3_spec.endpoint_url}" in result.output
    assert "wrong-secret-value" not in result.output
    inventory = runner.invoke(app, ["inventory", str(run)], env={"COLUMNS": "200"})
    assert inventory.exit_code == 0  # the local half of the inventory still answers
    assert "remote not checked: S3 rejected the credentials" in inventory.output
    assert "no remote" in inventory.output


def _ctx(run: Path, spec: S3Spec | None) -> StageContext:
    recipe = Recipe.model_validate({
        "name": "tinyrun", "dataset": {"sources": [{"name": "p", "path": "p.jsonl"}]},
        "target": {"model": "builtin:tiny-qwen3"}, "hardware": {"name": "cpu", "cpu_tflops": 0.1},
        "storage": {"s3": spec.model_dump() if spec else None}})
    return stage_context("backup", recipe, run)


def test_backup_stage_writes_receipt(s3_spec: S3Spec, tmp_path: Path) -> None:
    run = make_run(tmp_path, s3_spec)
    result = backup_stage(_ctx(run, s3_spec))
    receipt = json.loads((run / "backup" / result.artifacts["receipt"].path).read_text())
    assert receipt["ok"] is True and result.metrics["problems"] == 0
    assert result.metrics["bytes_verified"] == receipt["bytes_verified"] > 16384
    assert result.metrics["garbage_bytes"] == 400


def test_backup_stage_needs_s3(tmp_path: Path) -> None:
    with pytest.raises(StageFailed, match=r"needs storage\.s3"):
        backup_stage(_ctx(make_run(tmp_path), None))


def test_backup_of_a_run_whose_plan_predates_the_schema_warns_and_sends_the_run_files(
        s3_spec: S3Spec, s3_env: S3Server, tmp_path: Path) -> None:
    """An old plan.json (stages.eval.temperature, since moved) cannot be read, so PROGRESS.md cannot be
    rewritten: a warning names the file, and the run's own files are still sent and verified."""
    run = make_run(tmp_path, s3_spec)
    plan = json.loads((run / "plan.json").read_text())
    plan["resolved"]["stages"]["eval"]["temperature"] = 0.0
    (run / "plan.json").write_text(json.dumps(plan))
    result = runner.invoke(app, ["backup", str(run)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert f"warning: {run}/PROGRESS.md not refreshed: {run}/plan.json: " in result.output
    assert "safe to shut down" in result.output and not (run / "PROGRESS.md").exists()
    keys = {o["Key"] for o in s3_env.client().list_objects_v2(Bucket=s3_spec.bucket)["Contents"]}
    assert {f"runs/tinyrun/{name}" for name in ("plan.json", "recipe.yaml", "records.jsonl", "manifest.json")} <= keys
