"""The preflight's S3 probe against the real local S3 server (SeaweedFS, tests/s3_fixtures.py): head
bucket, put / read back / delete one object, with good and wrong credentials and a missing bucket."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from s3_fixtures import S3Server
from typer.testing import CliRunner

from dflashx.cli.main import app
from dflashx.config.schema import S3Spec
from dflashx.run.preflight import check_s3

pytestmark = pytest.mark.s3
REPO = Path(__file__).resolve().parents[1]


def test_good_credentials_put_read_and_delete_a_probe(s3_spec: S3Spec, s3_env: S3Server) -> None:
    check = check_s3(s3_spec, "tiny")
    assert check.status == "ok", check
    assert check.message.startswith(f"storage.s3: put, read back and deleted s3://{s3_spec.bucket}/runs/tiny/.preflight-")
    assert s3_env.client().list_objects_v2(Bucket=s3_spec.bucket).get("KeyCount") == 0  # the probe is gone


def test_wrong_secret_names_the_credentials_and_the_fix(s3_spec: S3Spec, monkeypatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    check = check_s3(s3_spec, "tiny")
    assert check.status == "fail"
    assert "S3 rejected the credentials" in check.message and s3_spec.endpoint_url in check.message
    assert check.fix == (f"set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) to keys valid for "
                         f"{s3_spec.endpoint_url}, or name a profile in storage.s3.aws_profile")


def test_missing_bucket_names_storage_s3_bucket(s3_spec: S3Spec) -> None:
    missing = s3_spec.model_copy(update={"bucket": s3_spec.bucket + "-missing"})
    check = check_s3(missing, "tiny")
    assert check.status == "fail"
    assert check.message == f"storage.s3.bucket: bucket {missing.bucket!r} does not exist at {s3_spec.endpoint_url}"
    assert check.fix == "create the bucket, or fix storage.s3.bucket"


def test_unreachable_endpoint_fails_with_the_endpoint_key(s3_env: S3Server) -> None:
    spec = S3Spec(bucket="b", endpoint_url="http://127.0.0.1:9", region="us-east-1", path_style=True)
    check = check_s3(spec, "tiny")
    assert check.status == "fail" and "storage.s3.endpoint_url" in check.fix


def test_cli_probes_s3_when_the_backup_stage_runs(s3_spec: S3Spec, monkeypatch) -> None:
    """The tiny recipe with the e2e test's backup overrides: the probe row is there and ok."""
    s3 = [f"storage.s3.bucket={s3_spec.bucket}", f"storage.s3.endpoint_url={s3_spec.endpoint_url}",
          "storage.s3.path_style=true", "storage.s3.region=us-east-1", "stages.backup.enabled=true"]
    result = CliRunner().invoke(app, ["preflight", str(REPO / "recipes" / "tiny.yaml"), *s3, "--json"])
    assert result.exit_code == 0, result.output
    checks = {c["code"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["s3"]["status"] == "ok"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    wrong = CliRunner().invoke(app, ["preflight", str(REPO / "recipes" / "tiny.yaml"), *s3, "--json"])
    assert wrong.exit_code == 1
    failed = [c for c in json.loads(wrong.stdout)["checks"] if c["status"] == "fail"]
    assert [c["code"] for c in failed] == ["s3"] and "AWS_SECRET_ACCESS_KEY" in failed[0]["fix"]
