"""`dflashx run` with the real backup stage to a real S3 server, then the ops commands on that run.

The other stages are the orchestrator tests' fakes (tests/test_run_fakes.py): this tests the
backup stage inside the orchestrator (manifest, records, W&B offline files being written while
the copy runs), not the data stages.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import test_run_fakes as fakes
from s3_fixtures import S3Server
from typer.testing import CliRunner

from dflashx.cli.main import app
from dflashx.config.schema import S3Spec
from dflashx.run import orchestrator
from dflashx.stages import backup as backup_stage
from dflashx.store.manifest import Manifest

pytestmark = [pytest.mark.s3, pytest.mark.slow]
runner = CliRunner()

@pytest.fixture
def pipeline_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    stages = {**fakes.FAKES, "backup": backup_stage.run}
    monkeypatch.setattr(orchestrator, "load_stage", stages.__getitem__)
    monkeypatch.setattr(logging.getLogger("dflashx"), "handlers", [])


def test_run_backs_up_to_s3_then_backup_says_safe_and_catches_corruption(
        tmp_path: Path, s3_spec: S3Spec, s3_env: S3Server, pipeline_stages: None) -> None:
    recipe = tmp_path / "recipe.yaml"
    s3 = {"bucket": s3_spec.bucket, "prefix": "runs/", "endpoint_url": s3_spec.endpoint_url, "region": "us-east-1",
          "path_style": True}
    fakes.write_recipe(recipe, fakes.write_prompts(tmp_path / "prompts.jsonl"), name="ops-e2e",
                       **{"tracking.mode": "offline", "storage": {"root": str(tmp_path), "s3": s3},
                          "stages.backup.enabled": True})
    run_dir = tmp_path / "ops-e2e"
    result = runner.invoke(app, ["run", str(recipe), "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    receipt = json.loads((run_dir / "backup" / "backup.json").read_text())
    assert receipt["ok"] and receipt["bytes_verified"] > 0
    manifest = Manifest.load(run_dir)
    assert all(e.remote is not None for e in manifest.entries.values() if e.name != "backup.receipt")
    assert (run_dir / "PROGRESS.md").is_file()

    again = runner.invoke(app, ["backup", str(run_dir)])
    assert again.exit_code == 0, again.output
    assert "safe to shut down" in again.output
    assert Manifest.load(run_dir).entries["backup.receipt"].remote is not None

    client = s3_env.client()
    key = f"runs/ops-e2e/{manifest.entries['export.drafter'].path}/config.json"
    client.put_object(Bucket=s3_spec.bucket, Key=key, Body=b"{}", Metadata={"sha256": "0" * 64})
    caught = runner.invoke(app, ["backup", str(run_dir), "--verify-only"])
    assert caught.exit_code == 1 and "export/drafter/config.json" in caught.output
    inventory = runner.invoke(app, ["inventory", str(run_dir)], env={"COLUMNS": "200"})
    assert inventory.exit_code == 0 and "export.drafter" in inventory.output and "differs" in inventory.output
