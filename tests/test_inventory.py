"""`dflashx inventory` / `dflashx gc` and PROGRESS.md on a run folder built like the orchestrator's."""

from __future__ import annotations

from pathlib import Path

from s3_fixtures import make_run
from typer.testing import CliRunner

from dflashx.cli.main import app
from dflashx.report.progress import write_progress
from dflashx.store.backup import backup_run
from dflashx.store.inventory import build_inventory
from dflashx.store.local import LocalStore
from dflashx.store.manifest import Manifest

runner = CliRunner()


def _rows(run: Path, store: LocalStore | None, rehash: bool = False) -> dict[str, tuple[str, str, str]]:
    return {r.name: (r.where, r.local, r.remote) for r in build_inventory(run, store, rehash).rows}


def test_inventory_tracks_where_each_artifact_is(tmp_path: Path) -> None:
    run, store = make_run(tmp_path), LocalStore(tmp_path / "remote")
    assert _rows(run, store)["train.checkpoint"] == ("local", "ok", "missing")
    backup_run(run, store)
    (run / "train/train.log").unlink()
    rows = _rows(run, store)
    assert rows["train.checkpoint"] == ("both", "ok", "ok")
    assert rows["train.logs"] == ("remote", "missing", "ok")
    assert rows["generate.completions"] == ("local", "ok", "missing")
    inv = build_inventory(run, store)
    assert inv.totals["garbage"] == {"artifacts": 1, "bytes": 400, "local_bytes": 400, "remote_bytes": 0}
    assert inv.totals["replaceable"]["local_bytes"] == 0 and inv.totals["replaceable"]["remote_bytes"] == 16


def test_rehash_finds_same_size_edits(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    path = run / "train/checkpoint/model.safetensors"
    path.write_bytes(b"\0" * path.stat().st_size)
    assert _rows(run, None)["train.checkpoint"][1] == "ok"  # sizes only
    assert _rows(run, None, rehash=True)["train.checkpoint"][1] == "changed"
    (run / "ingest/prompts/shard-0.jsonl").unlink()
    assert _rows(run, None)["ingest.prompts"] == ("local", "partial", "no remote")


def test_inventory_cli_prints_table_and_totals(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    result = runner.invoke(app, ["inventory", str(run), "--to", str(tmp_path / "remote")],
                           env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    for text in ("train.checkpoint", "irreplaceable", "16.0 KiB", "totals per tier", "garbage", "missing"):
        assert text in result.output


def test_gc_asks_then_deletes_garbage_only(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    declined = runner.invoke(app, ["gc", str(run)], input="n\n")
    assert declined.exit_code == 1 and (run / "generate.superseded-abcd1234").is_dir()
    result = runner.invoke(app, ["gc", str(run)], input="y\n")
    assert result.exit_code == 0, result.output
    assert "400 B freed" in result.output
    assert not (run / "generate.superseded-abcd1234").exists()
    assert sorted(Manifest.load(run).entries) == ["ingest.prompts", "train.checkpoint", "train.logs"]
    assert (run / "train/checkpoint/model.safetensors").is_file()
    assert "no garbage" in runner.invoke(app, ["gc", str(run), "--yes"]).output


def test_gc_remote_deletes_remote_copies_of_garbage(tmp_path: Path) -> None:
    run, remote = make_run(tmp_path), tmp_path / "remote"
    garbage = LocalStore(remote)
    garbage.put(run / "generate.superseded-abcd1234/completions/c.jsonl",
                "tinyrun/generate.superseded-abcd1234/completions/c.jsonl")
    result = runner.invoke(app, ["gc", str(run), "--yes", "--remote", "--to", str(remote)])
    assert result.exit_code == 0, result.output
    assert list(garbage.list("tinyrun/")) == []


def test_progress_says_what_comes_next(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    text = write_progress(run).read_text()
    assert "| train | done | 1.3 min | 1.7 min | loss=1.25, tokens_per_s=900 |" in text
    assert "| generate | pending |" in text and "| backup | skipped-disabled |" in text
    assert "Run the remaining stages (generate, qc, tokenize, eval, export): `dflashx run recipes/tiny.yaml`" in text
    assert f"`dflashx backup {run}`" in text and f"`dflashx gc {run}`" in text
    backup_run(run, LocalStore(tmp_path / "remote"))
    after = write_progress(run).read_text()
    assert "dflashx backup" not in after and str(tmp_path / "remote/tinyrun/train/checkpoint") in after
