"""Verified backup to a local folder remote (another disk / NFS), the CLI and PROGRESS.md."""

from __future__ import annotations

import json
from pathlib import Path

from s3_fixtures import make_run
from typer.testing import CliRunner

from dflashx.cli.main import app
from dflashx.report.progress import write_progress
from dflashx.store.backup import backup_run
from dflashx.store.local import LocalStore
from dflashx.store.manifest import Manifest

runner = CliRunner()


def _backup(run: Path, remote: Path, *extra: str):
    return runner.invoke(app, ["backup", str(run), "--to", str(remote), *extra])


def test_backup_copies_live_artifacts_and_run_files_then_says_safe(tmp_path: Path) -> None:
    run, remote = make_run(tmp_path), tmp_path / "remote"
    result = _backup(run, remote)
    assert result.exit_code == 0, result.output
    assert "safe to shut down" in result.output
    copied = sorted(p.relative_to(remote / "tinyrun").as_posix()
                    for p in (remote / "tinyrun").rglob("*") if p.is_file())
    assert copied == ["PROGRESS.md", "ingest/_SUCCESS", "ingest/prompts/shard-0.jsonl",
                      "ingest/prompts/shard-1.jsonl", "manifest.json", "plan.json", "recipe.yaml",
                      "records.jsonl", "run.json", "train/_SUCCESS", "train/checkpoint/model.safetensors",
                      "train/provenance.json", "train/train.log"]
    assert "generate.completions" in result.output and "400 B" in result.output  # garbage listed
    manifest = Manifest.load(run)
    assert manifest.entries["train.checkpoint"].remote.uri == str(remote / "tinyrun/train/checkpoint")
    assert manifest.entries["generate.completions"].remote is None
    # the copied manifest is the one that records the remote copies
    assert json.loads((remote / "tinyrun/manifest.json").read_text())["artifacts"]["ingest.prompts"]["remote"]
    assert "verified" in (run / "PROGRESS.md").read_text()


def test_second_backup_uploads_nothing_but_verifies_everything(tmp_path: Path) -> None:
    run, store = make_run(tmp_path), LocalStore(tmp_path / "remote")
    first = backup_run(run, store, before_run_files=write_progress)
    second = backup_run(run, store, before_run_files=write_progress)
    assert first.ok and second.ok
    artifact_files = [f for f in second.files if f.artifact != "run"]
    assert artifact_files and not any(f.uploaded for f in artifact_files)
    assert {f.status for f in second.files} == {"verified"}


def test_corrupted_remote_copy_fails_backup_and_repair_fixes_it(tmp_path: Path) -> None:
    run, remote = make_run(tmp_path), tmp_path / "remote"
    assert _backup(run, remote).exit_code == 0
    target = remote / "tinyrun/train/checkpoint/model.safetensors"
    target.write_bytes(b"\1" * target.stat().st_size)  # same size and recorded sha256, wrong bytes
    result = _backup(run, remote)
    assert result.exit_code == 1
    assert "safe to shut down" not in result.output
    assert "mismatch" in result.output and "train/checkpoint/model.safetensors" in result.output
    assert _backup(run, remote, "--verify-only").exit_code == 1
    repaired = _backup(run, remote, "--repair")
    assert repaired.exit_code == 0 and "safe to shut down" in repaired.output
    assert target.read_bytes() == (run / "train/checkpoint/model.safetensors").read_bytes()


def test_local_file_changed_since_registration_is_not_sent(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    (run / "ingest/prompts/shard-1.jsonl").write_text("tampered\n")
    report = backup_run(run, LocalStore(tmp_path / "remote"))
    assert not report.ok
    assert [(p.rel, p.status) for p in report.problems] == [("ingest/prompts/shard-1.jsonl", "local-changed")]
    assert not (tmp_path / "remote/tinyrun/ingest/prompts/shard-1.jsonl").exists()
    assert Manifest.load(run).entries["ingest.prompts"].remote is None


def test_verify_only_reports_missing_remote_copies(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    report = backup_run(run, LocalStore(tmp_path / "remote"), verify_only=True)
    assert not report.ok and {p.status for p in report.problems} == {"missing"}
    assert not (tmp_path / "remote").exists()


def test_only_irreplaceable_skips_replaceable(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    report = backup_run(run, LocalStore(tmp_path / "remote"), include_replaceable=False)
    assert report.ok
    assert "train/train.log" not in {f.rel for f in report.files}
    assert Manifest.load(run).entries["train.logs"].remote is None


def test_backup_without_remote_configured_says_how(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    result = runner.invoke(app, ["backup", str(run)])
    assert result.exit_code == 1
    assert "has no storage.s3" in result.output and "--to FOLDER" in result.output


def test_run_files_written_during_backup_are_sent_as_snapshots(tmp_path: Path) -> None:
    run, remote = make_run(tmp_path), tmp_path / "remote"
    records = run / "records.jsonl"

    def keep_writing(_: int) -> None:  # a running stage appending records while the backup runs
        with open(records, "a") as f:
            f.write('{"event": "metrics"}\n')

    report = backup_run(run, LocalStore(remote), progress=keep_writing)
    assert report.ok, report.problems
    sent = (remote / "tinyrun/records.jsonl").read_text()
    assert records.read_text().startswith(sent) and len(records.read_text()) > len(sent)
    assert not [p for p in (run / ".backup").rglob("*") if p.is_file() and "snapshot" in p.parts]
