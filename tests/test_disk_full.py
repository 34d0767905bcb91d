"""A full disk is a stop, not a corruption: generation, tokenization and checkpoint saves stop with
a message naming the folder and the space needed, keep the last complete record / dataset /
checkpoint intact, and resume to the same result as an uninterrupted run once space is freed.

`FakeDisk` injects the fault anywhere: writes under a folder past a byte budget write what fits,
then fail with ENOSPC, at the level each writer uses (`os.write`: the shard writer; fsspec's local
file `.write`: `datasets`/Arrow; `torch.save`: DeepSpeed, rank states). `small_fs` mounts a real
tmpfs with `size=`, which needs root mount privileges (skipped where mounting is refused); it shows
what injection cannot: a real `torch.save` on a full disk raises a RuntimeError without errno.
"""

from __future__ import annotations

import errno
import json
import random
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from datasets import load_from_disk
from helpers_disk import FakeDisk, assert_stop_message, full, resize
from helpers_models import make_recipe, stage_context
from helpers_tokenizer import completion_record, tokenizer_dir
from openai_server import Script, ScriptedOpenAIServer, expected_reply
from test_generate_resume import child as generate_once

from dflashx.data.jsonl import ShardWriter, iter_shards, shard_path, shard_paths, write_jsonl_atomic
from dflashx.plan.context import Estimates
from dflashx.plan.plan import StagePlan
from dflashx.stages import tokenize as tokenize_stage
from dflashx.stages.base import StageFailed
from dflashx.stages.generate import _still_needed
from dflashx.store import diskspace
from dflashx.store.atomic import replace_dir
from dflashx.store.diskspace import DiskFull, is_disk_full, stop_when_full
from dflashx.store.hashing import digest_path


def test_what_counts_as_a_full_disk(tmp_path, monkeypatch):
    assert all(is_disk_full(e) for e in (full(), OSError(errno.EDQUOT, "Disk quota exceeded"), RuntimeError(
        "Error while serializing: I/O error: No space left on device (os error 28)")))  # safetensors' words
    wrapped = ValueError("a library's own error")
    wrapped.__cause__ = full()
    assert is_disk_full(wrapped)
    opaque = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")  # torch.save
    assert not is_disk_full(opaque, tmp_path) and not is_disk_full(OSError(errno.EIO, "I/O error"))
    monkeypatch.setattr(diskspace.shutil, "disk_usage", lambda p: SimpleNamespace(total=10, used=10, free=0))
    assert is_disk_full(opaque, tmp_path)  # any failure with nothing free is the disk


def test_stop_when_full_cleans_up_and_names_folder_and_space(tmp_path):
    cleaned = []
    with pytest.raises(DiskFull) as stop, stop_when_full(tmp_path, "a thing", needed=lambda: 3 << 20,
                                                         cleanup=lambda: cleaned.append(1)):
        raise full()
    assert cleaned == [1]
    assert_stop_message(str(stop.value), tmp_path)
    assert "about 3.0 MiB needed" in str(stop.value) and "writing a thing" in str(stop.value)
    with pytest.raises(KeyError), stop_when_full(tmp_path, "a thing", cleanup=lambda: cleaned.append(2)):
        raise KeyError("x")  # anything else passes through unchanged (after the cleanup)
    assert cleaned == [1, 2]


def test_replace_dir_puts_the_old_folder_back_when_the_new_one_cannot_go_in(tmp_path, monkeypatch):
    for folder in ("old", "new"):
        (tmp_path / folder).mkdir()
    (tmp_path / "old" / "f").write_text("old")
    real, calls = os.replace, []

    def replace(src, dst):  # the second rename (the new folder into place) finds the disk full
        calls.append(src)
        if len(calls) == 2:
            raise full()
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError):
        replace_dir(tmp_path / "new", tmp_path / "old")
    assert (tmp_path / "old" / "f").read_text() == "old" and (tmp_path / "new").is_dir()


def _prompts(run_dir: Path, n: int = 60) -> list[dict]:
    rows = [{"id": f"id{i:04d}", "source": "s", "messages": [{"role": "user", "content": f"prompt {i}"}]}
            for i in range(n)]
    write_jsonl_atomic(run_dir / "ingest" / "prompts" / "shard-00000.jsonl", rows)
    return rows


def _completions(run_dir: Path) -> dict[str, dict]:
    return {r["id"]: r for r in iter_shards(run_dir / "generate" / "completions")}


def test_generate_stops_on_a_full_disk_and_resumes_without_duplicates_or_gaps(tmp_path, monkeypatch):
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    rows = _prompts(ref_dir)
    _prompts(run_dir)
    with ScriptedOpenAIServer(Script()) as server:
        generate_once(ref_dir, server.url)  # uninterrupted
        reference = _completions(ref_dir)
        room = sum(len(json.dumps(r)) for r in reference.values()) // 2
        disk = FakeDisk(monkeypatch, run_dir / "generate", room=room)
        with pytest.raises(StageFailed) as stop:
            generate_once(run_dir, server.url)
        out = run_dir / "generate" / "completions"
        assert_stop_message(str(stop.value), out)
        kept = {p: p.read_bytes() for p in shard_paths(out)}
        assert all(b.endswith(b"\n") for b in kept.values() if b)  # whole fsync'ed batches only, nothing torn
        partial = _completions(run_dir)
        assert 0 < len(partial) < len(rows) and all(partial[i] == reference[i] for i in partial)
        disk.room = None  # space freed
        generate_once(run_dir, server.url)
    assert all(p.read_bytes().startswith(b) for p, b in kept.items())  # the complete records stayed as they were
    ids = [r["id"] for r in iter_shards(out)]
    assert len(ids) == len(set(ids)) == len(rows)
    assert _completions(run_dir) == reference
    for r in reference.values():
        assert (r["reasoning"], r["answer"]) == expected_reply(r["messages"])


def test_the_generate_stop_says_what_the_plan_still_needs(tmp_path):
    (tmp_path / "shard-00000.jsonl").write_bytes(b"x" * 2048)
    planned = StagePlan("generate", True, estimates=Estimates(storage_bytes=8 << 20))
    stop = _still_needed(DiskFull(tmp_path, "records", 100), SimpleNamespace(runtime=planned))
    assert "about 8.0 MiB needed (to finish: the plan's 8.0 MiB for generate, 2.0 KiB written)" in str(stop)


def test_shard_writer_on_a_real_small_file_system(small_fs):
    where = small_fs("16k")
    records = [{"id": f"r{i:04d}", "text": "x" * 180} for i in range(200)]  # ~40 KB: far more than 16 KiB
    with pytest.raises(DiskFull) as stop, ShardWriter(where / "out", flush_every=7) as w:
        for r in records:
            w.write(r)
    assert_stop_message(str(stop.value), where / "out")
    written = [r["id"] for r in iter_shards(where / "out")]
    assert written and len(written) % 7 == 0 and written == [r["id"] for r in records[:len(written)]]
    resize(where, "1m")
    with ShardWriter(where / "out", flush_every=7) as w:
        assert w.truncated_bytes == 0 and w.resumed == len(written)
        for r in records:
            w.write(r)
    assert list(iter_shards(where / "out")) == records


def test_tokenize_stops_on_a_full_disk_keeps_the_old_dataset_and_resumes(tmp_path, monkeypatch):
    tok = tokenizer_dir(str(tmp_path / "tok"))
    rng = random.Random(5)
    records = [completion_record(rng, i) for i in range(120)]
    write_jsonl_atomic(shard_path(tmp_path / "old", 0), records[:30])
    write_jsonl_atomic(shard_path(tmp_path / "all", 0), records)
    recipe = make_recipe(target={"model": str(tok), "tokenizer": str(tok), "precision": "fp32"},
                         drafter={"block_size": 8},
                         stages={"tokenize": {"max_length": 256, "num_proc": 1, "shard_size": 40}})

    def tokenize(run_dir: Path, source: str) -> Path:
        tokenize_stage.run(stage_context("tokenize", recipe, run_dir, {"generate.completions": tmp_path / source}))
        return run_dir / "tokenize" / "dataset"

    disk = FakeDisk(monkeypatch, tmp_path / "ref")
    reference = digest_path(tokenize(tmp_path / "ref", "all")).sha256  # uninterrupted; `disk` counts its bytes
    old = digest_path(tokenize(tmp_path / "run", "old"))
    final = tmp_path / "run" / "tokenize" / "dataset"
    disk = FakeDisk(monkeypatch, tmp_path / "run", room=disk.written - 2 * old.size)  # fills during the save
    with pytest.raises(StageFailed) as stop:
        tokenize(tmp_path / "run", "all")
    assert_stop_message(str(stop.value), tmp_path / "run" / "tokenize")
    assert digest_path(final).sha256 == old.sha256  # the last complete dataset, untouched and loadable
    assert len(load_from_disk(str(final))) > 0
    assert sorted(p.name for p in final.parent.iterdir()) == ["dataset"]  # scratch and partial save removed
    disk.room = None
    assert digest_path(tokenize(tmp_path / "run", "all")).sha256 == reference
