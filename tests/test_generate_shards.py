"""The append-only shard writer: batching, rolling, resume, torn-line repair, corruption."""

from __future__ import annotations

import json

import pytest

from dflashx.data.jsonl import CorruptShardError, ShardWriter, count_records, iter_shards, shard_paths


def rec(i: int) -> dict:
    return {"id": f"id{i}", "answer": f"answer {i}"}


def test_writes_flush_in_batches_and_roll_shards(tmp_path):
    writer = ShardWriter(tmp_path, shard_size=4, flush_every=3)
    for i in range(2):
        writer.write(rec(i))
    assert count_records(tmp_path) == 0  # still buffered
    writer.write(rec(2))
    assert count_records(tmp_path) == 3  # one fsync'ed batch
    for i in range(3, 10):
        writer.write(rec(i))
    writer.close()
    assert [p.name for p in shard_paths(tmp_path)] == ["shard-00000.jsonl", "shard-00001.jsonl", "shard-00002.jsonl"]
    assert [r["id"] for r in iter_shards(tmp_path)] == [f"id{i}" for i in range(10)]


def test_resume_skips_written_ids_and_continues_the_last_shard(tmp_path):
    with ShardWriter(tmp_path, shard_size=5, flush_every=2) as w:
        for i in range(7):
            w.write(rec(i))
    with ShardWriter(tmp_path, shard_size=5, flush_every=2) as w:
        assert w.resumed == 7 and w.ids == {f"id{i}" for i in range(7)}
        assert w.write(rec(3)) is False  # already there
        for i in range(7, 12):
            assert w.write(rec(i)) is True
    lines = [len(p.read_text().splitlines()) for p in shard_paths(tmp_path)]
    assert lines == [5, 5, 2]
    assert [r["id"] for r in iter_shards(tmp_path)] == [f"id{i}" for i in range(12)]


@pytest.mark.parametrize("tail", [b'{"id": "id9", "answ', b'{"id": "id9"}', b"\x00\x00\x00"])
def test_torn_last_line_is_truncated_on_resume(tmp_path, tail):
    with ShardWriter(tmp_path, flush_every=1) as w:
        for i in range(3):
            w.write(rec(i))
    shard = shard_paths(tmp_path)[0]
    whole = shard.read_bytes()
    with shard.open("ab") as f:
        f.write(tail)  # a kill in the middle of a write leaves no newline
    w = ShardWriter(tmp_path, flush_every=1)
    assert w.truncated_bytes == len(tail) and w.ids == {"id0", "id1", "id2"}
    assert shard.read_bytes() == whole
    w.write(rec(9))
    w.close()
    assert [json.loads(x)["id"] for x in shard.read_text().splitlines()] == ["id0", "id1", "id2", "id9"]


def test_bad_line_in_the_middle_is_corruption_not_a_torn_write(tmp_path):
    (tmp_path / "shard-00000.jsonl").write_text('{"id": "a"}\n{broken\n{"id": "b"}\n')
    with pytest.raises(CorruptShardError, match=r"shard-00000.jsonl: line 2"):
        ShardWriter(tmp_path)
