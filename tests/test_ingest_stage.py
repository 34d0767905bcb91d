"""The ingest stage on real local files: JSONL, JSON arrays, Parquet, folders; counts and shards."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers_models import make_recipe, stage_context

from dflashx.data.jsonl import iter_jsonl, iter_shards, shard_paths
from dflashx.data.sources import SourceError
from dflashx.stages import ingest


def write_jsonl(path: Path, rows: list, raw_lines: dict[int, str] | None = None) -> Path:
    """Rows as JSONL; `raw_lines` puts literal text at 1-based line numbers (to plant bad lines)."""
    lines = [json.dumps(r) for r in rows]
    for lineno, text in sorted((raw_lines or {}).items()):
        lines.insert(lineno - 1, text)
    path.write_text("\n".join(lines) + "\n")
    return path


def run_ingest(tmp_path: Path, sources: list[dict], **dataset):
    shard_size = dataset.pop("shard_size", 50_000)
    recipe = make_recipe(sources, dataset={"sources": sources, **dataset},
                         stages={"ingest": {"shard_size": shard_size}})
    logged = []
    ctx = stage_context("ingest", recipe, tmp_path / "run", log=lambda m, step=None: logged.append(m))
    result = ingest.run(ctx)
    return ctx, result, logged


def msgs(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "old answer"}]}


def test_sources_are_normalised_deduped_counted_and_sharded(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [msgs(f"question {i}") for i in range(30)] + [msgs("question 3")],
                    raw_lines={5: "{not json", 9: json.dumps({"messages": []})})
    b = tmp_path / "b.parquet"
    pq.write_table(pa.Table.from_pylist(
        [{"instruction": f"task {i}", "input": "", "output": "x"} for i in range(20)]
        + [{"instruction": "question 7", "input": "", "output": "dup of a"}]
    ), b)
    sources = [{"name": "a", "path": str(a), "format": "messages"},
               {"name": "b", "path": str(b), "format": "alpaca", "cap": 15}]
    recipe = make_recipe(sources, dataset={"sources": sources, "eval_holdout": 5},
                         stages={"ingest": {"shard_size": 12}})
    logged = []
    ctx = stage_context("ingest", recipe, tmp_path / "run", log=lambda m, step=None: logged.append(m))
    result = ingest.run(ctx)
    m = result.metrics

    assert m["sources"]["a"]["read"] == 33
    assert m["sources"]["a"]["malformed"] == 2
    assert [w.rsplit(":", 1)[1] for w in m["sources"]["a"]["malformed_lines"]] == ["5", "9"]
    assert m["sources"]["a"]["deduped"] == 1 and m["sources"]["a"]["kept"] == 30
    assert m["sources"]["b"]["deduped"] == 1  # "question 7" already came from source a
    assert m["sources"]["b"]["capped"] == 5 and m["sources"]["b"]["kept"] == 15
    assert m["prompts"] + m["eval_prompts"] == 45 and m["eval_prompts"] == 5
    assert logged and logged[-1]["prompts"] == m["prompts"]

    out = ctx.out_dir
    assert set(result.artifacts) == {"prompts", "eval_prompts"}
    shards = shard_paths(out / result.artifacts["prompts"].path)
    assert [len(list(iter_jsonl(s))) for s in shards] == [12, 12, 12, 4] and m["shards"] == 4
    train = list(iter_shards(out / "prompts"))
    held = list(iter_jsonl(out / "eval_prompts.jsonl"))
    ids = [r["id"] for r in train + held]
    assert len(ids) == len(set(ids)) == 45
    assert {r["source"] for r in train} == {"a", "b"}
    assert all(r["messages"][-1]["role"] == "user" for r in train + held)  # old answers dropped
    assert not (out / "prompts.partial").exists()


def test_order_is_seeded_and_independent_of_file_order(tmp_path):
    rows = [{"prompt": f"p{i}"} for i in range(40)]
    fwd = write_jsonl(tmp_path / "fwd.jsonl", rows)
    rev = write_jsonl(tmp_path / "rev.jsonl", rows[::-1])

    def order(path: Path, seed: int, name: str) -> list[str]:
        src = [{"name": "s", "path": str(path), "format": "prompt"}]
        ctx, _, _ = run_ingest(tmp_path / name, src, shuffle_seed=seed, eval_holdout=4)
        return [r["id"] for r in iter_jsonl(ctx.out_dir / "eval_prompts.jsonl")] + \
               [r["id"] for r in iter_shards(ctx.out_dir / "prompts")]

    assert order(fwd, 0, "r1") == order(rev, 0, "r2")
    assert order(fwd, 0, "r3") != order(fwd, 1, "r4")
    assert sorted(order(fwd, 0, "r5")) == sorted(order(fwd, 1, "r6"))


def test_cap_keeps_a_seeded_sample_not_the_file_head(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [{"prompt": f"p{i}"} for i in range(100)])
    ctx, _, _ = run_ingest(tmp_path, [{"name": "s", "path": str(path), "cap": 10}])
    kept = {r["messages"][0]["content"] for r in iter_shards(ctx.out_dir / "prompts")}
    assert len(kept) == 10 and kept != {f"p{i}" for i in range(10)}


def test_without_dedupe_duplicates_stay_with_unique_ids(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "same"}] * 3 + [{"prompt": "other"}])
    ctx, result, _ = run_ingest(tmp_path, [{"name": "s", "path": str(path)}], dedupe=False)
    ids = [r["id"] for r in iter_shards(ctx.out_dir / "prompts")]
    assert len(ids) == len(set(ids)) == 4 and result.metrics["deduped"] == 0


def test_folder_and_json_array_sources(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    write_jsonl(folder / "one.jsonl", [{"prompt": "x1"}, {"prompt": "x2"}])
    (folder / "two.json").write_text(json.dumps([{"prompt": "y1"}, {"prompt": "y2"}, {"prompt": "y3"}]))
    (folder / "notes.txt").write_text("ignored")
    _, result, _ = run_ingest(tmp_path, [{"name": "f", "path": str(folder)}])
    assert result.metrics["sources"]["f"]["kept"] == 5


def test_wrong_format_fails_naming_the_source_and_fix(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [msgs("a"), msgs("b")])
    with pytest.raises(SourceError, match=r"all 2 records are malformed.*s\.jsonl:1.*dataset.sources\[s\]\.format"):
        run_ingest(tmp_path, [{"name": "s", "path": str(path), "format": "alpaca"}])


def test_missing_file_and_oversized_holdout_are_clear_errors(tmp_path):
    with pytest.raises(SourceError, match=r"nope\.jsonl does not exist.*dataset.sources\[s\]\.path"):
        run_ingest(tmp_path, [{"name": "s", "path": str(tmp_path / "nope.jsonl")}])
    path = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    with pytest.raises(SourceError, match=r"lower dataset\.eval_holdout"):
        run_ingest(tmp_path, [{"name": "s", "path": str(path)}], eval_holdout=2)


def test_rerun_replaces_previous_shards(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [{"prompt": f"p{i}"} for i in range(10)])
    run_ingest(tmp_path, [{"name": "s", "path": str(path)}], shard_size=3)
    path.write_text("\n".join(json.dumps({"prompt": f"q{i}"}) for i in range(2)) + "\n")
    ctx, _, _ = run_ingest(tmp_path, [{"name": "s", "path": str(path)}], shard_size=3)
    assert [r["messages"][0]["content"] for r in iter_shards(ctx.out_dir / "prompts")] in (["q0", "q1"], ["q1", "q0"])


def test_builtin_tiny_prompts_source(tmp_path):
    import dflashx.tiny

    if not hasattr(dflashx.tiny, "locate_builtin"):
        pytest.skip("dflashx.tiny.locate_builtin is not written yet (the tiny-target engineer's)")
    _, result, _ = run_ingest(tmp_path, [{"name": "tiny", "path": "builtin:tiny-prompts", "format": "messages"}],
                              eval_holdout=4)
    assert result.metrics["sources"]["tiny"]["malformed"] == 0 and result.metrics["prompts"] > 0


def test_datasets_id_source_streams_through_datasets(tmp_path):
    # `datasets.load_dataset` also takes a local folder: the hub code path without a network.
    repo = tmp_path / "hub_copy"
    repo.mkdir()
    write_jsonl(repo / "train.jsonl", [{"instruction": f"task {i}", "output": "x"} for i in range(6)])
    _, result, _ = run_ingest(tmp_path, [{"name": "h", "hf_id": str(repo), "format": "alpaca"}])
    assert result.metrics["sources"]["h"]["kept"] == 6


def test_unreachable_datasets_id_says_to_use_a_local_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(SourceError, match=r"cannot open datasets id 'nobody/nothing-here'.*use `path:`"):
        run_ingest(tmp_path, [{"name": "h", "hf_id": "nobody/nothing-here"}])
