"""Manifest and hashing: registration, folder hashes, round trip, garbage, remote copies."""

from __future__ import annotations

import hashlib
import json
import shutil
from datetime import UTC, datetime

import pytest

from dflashx.store.hashing import digest_path, fingerprint, sha256_file
from dflashx.store.manifest import Manifest, atomic_write_json


def _folder(root):
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("alpha")
    (root / "sub" / "b.bin").write_bytes(bytes(range(256)) * 1000)
    return root


def test_file_sha_matches_hashlib(tmp_path):
    data = b"x" * (3 * 2**20 + 17)  # spans several read chunks
    (tmp_path / "f").write_bytes(data)
    assert sha256_file(tmp_path / "f") == hashlib.sha256(data).hexdigest()


def test_folder_hash_is_stable_and_content_sensitive(tmp_path):
    one = _folder(tmp_path / "one")
    two = tmp_path / "elsewhere" / "two"
    shutil.copytree(one, two)
    d1, d2 = digest_path(one), digest_path(two)
    assert d1.kind == "dir" and d1.sha256 == d2.sha256 and d1.size == 5 + 256_000
    assert set(d1.files) == {"a.txt", "sub/b.bin"}
    assert d1.files["a.txt"].sha256 == hashlib.sha256(b"alpha").hexdigest()
    (two / "sub" / "b.bin").rename(two / "b.bin")  # same bytes, other path: another folder
    assert digest_path(two).sha256 != d1.sha256
    with pytest.raises(FileNotFoundError):
        digest_path(tmp_path / "nope")


def test_fingerprint_reads_only_the_edges_of_big_files(tmp_path):
    big = tmp_path / "w.bin"
    big.write_bytes(b"a" * 4096 + b"b" * 4096 + b"c" * 4096)
    base = fingerprint(big, small=1024, edge=1024)
    data = bytearray(big.read_bytes())
    data[6000] = ord("z")  # the unread middle
    big.write_bytes(bytes(data))
    assert fingerprint(big, small=1024, edge=1024) == base
    data[-1] = ord("z")
    big.write_bytes(bytes(data))
    assert fingerprint(big, small=1024, edge=1024) != base
    assert fingerprint(big) == sha256_file(big)  # small enough to hash fully by default


def test_register_save_load_round_trip(tmp_path):
    _folder(tmp_path / "train" / "checkpoint")
    (tmp_path / "ingest").mkdir()
    (tmp_path / "ingest" / "eval.jsonl").write_text("{}\n")
    m = Manifest.load(tmp_path)
    assert m.entries == {}
    ckpt = m.register("train", "checkpoint", tmp_path / "train" / "checkpoint", "irreplaceable",
                      inputs=["tokenize.dataset"], stage_key="k" * 64)
    m.register("ingest", "eval_prompts", "ingest/eval.jsonl", "replaceable", regen_cost_usd=1.5)
    m.save()
    loaded = Manifest.load(tmp_path)
    assert loaded.entries == m.entries
    entry = loaded.entries["train.checkpoint"]
    assert (entry.path, entry.kind, entry.stage, entry.artifact) == ("train/checkpoint", "dir", "train", "checkpoint")
    assert entry.sha256 == ckpt.sha256 == digest_path(tmp_path / "train" / "checkpoint").sha256
    assert entry.files["sub/b.bin"].size == 256_000
    assert loaded.entries["ingest.eval_prompts"].files is None
    assert loaded.entries["ingest.eval_prompts"].regen_cost_usd == 1.5
    assert [e.name for e in loaded.by_stage("train")] == ["train.checkpoint"]
    raw = json.loads((tmp_path / "manifest.json").read_text())
    assert raw["version"] == 1 and "train.checkpoint" in raw["artifacts"]


def test_garbage_supersede_and_remote(tmp_path):
    _folder(tmp_path / "train" / "checkpoint")
    m = Manifest(tmp_path)
    m.register("train", "checkpoint", "train/checkpoint", "irreplaceable")
    m.register("train", "logs", "train/checkpoint/a.txt", "replaceable")
    m.update_remote("train.checkpoint", "s3://b/run/train/checkpoint", "abc",
                    datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert m.entries["train.checkpoint"].remote.verified_at == "2026-01-02T03:04:05+00:00"
    m.mark_garbage("train.logs")
    assert [e.name for e in m.live()] == ["train.checkpoint"]
    assert len(m.by_stage("train", include_garbage=True)) == 2
    (tmp_path / "train").rename(tmp_path / "train.superseded-1234abcd")
    moved = m.supersede("train", "train.superseded-1234abcd")
    assert [e.name for e in moved] == ["train.checkpoint@train.superseded-1234abcd"]
    entry = m.entries["train.checkpoint@train.superseded-1234abcd"]
    assert entry.tier == "garbage" and entry.path == "train.superseded-1234abcd/checkpoint"
    with pytest.raises(KeyError, match=r"no artifact 'train\.checkpoint'"):
        m.update_remote("train.checkpoint", "s3://x", "y", "now")


def test_bad_paths_and_files(tmp_path):
    m = Manifest(tmp_path / "run")
    (tmp_path / "run").mkdir()
    (tmp_path / "outside.txt").write_text("x")
    with pytest.raises(ValueError, match="outside the run dir"):
        m.register("ingest", "x", tmp_path / "outside.txt", "replaceable")
    with pytest.raises(FileNotFoundError):
        m.register("ingest", "x", "missing.txt", "replaceable")
    (tmp_path / "run" / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"manifest\.json: not a dflashx manifest"):
        Manifest.load(tmp_path / "run")


def test_atomic_write_leaves_no_temp_files(tmp_path):
    atomic_write_json(tmp_path / "x.json", {"a": 1})
    atomic_write_json(tmp_path / "x.json", {"a": 2})
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]
