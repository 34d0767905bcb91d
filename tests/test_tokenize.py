"""Tokenize stage: JSONL completions -> Arrow dataset with assistant loss masks, policies and counts."""

from __future__ import annotations

import random

import numpy as np
import pytest
from datasets import load_from_disk

from dflashx.data.chat_mask import ChatMasker, completion_messages
from dflashx.data.jsonl import shard_path, write_jsonl_atomic
from dflashx.stages.tokenize import TokenizePolicy, tokenize_completions
from helpers_tokenizer import completion_record, tokenizer_dir


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return tokenizer_dir(str(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def records():
    rng = random.Random(3)
    recs = [completion_record(rng, i, source=f"src{i % 3}") for i in range(240)]
    recs[10]["error"] = "HTTP 500 after 5 retries"
    recs[11].update(reasoning="", answer="OK.")  # a tiny response: too few loss tokens
    recs[12]["reasoning"] = " ".join(["long"] * 400)  # far past max_length
    return recs


@pytest.fixture(scope="module")
def completions(tmp_path_factory, records):
    folder = tmp_path_factory.mktemp("completions")
    write_jsonl_atomic(shard_path(folder, 0), records[:100])
    write_jsonl_atomic(shard_path(folder, 1), records[100:])
    return folder


POLICY = TokenizePolicy(max_length=256, overflow="drop", min_loss_tokens=16)


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory, completions, tok_dir):
    out = tmp_path_factory.mktemp("tok_out")
    metrics = tokenize_completions(completions, out, tok_dir, POLICY, num_proc=1, shard_size=100)
    return out, metrics


def test_dataset_rows_match_the_masker_exactly(tokenized, records, tok_dir):
    out, metrics = tokenized
    ds = load_from_disk(str(out / "dataset"))
    assert set(ds.column_names) == {"id", "source", "input_ids", "loss_mask", "length"}
    assert ds.features["input_ids"].feature.dtype == "int32" and ds.features["loss_mask"].feature.dtype == "uint8"
    masker = ChatMasker.from_path(tok_dir)
    by_id = {r["id"]: r for r in records}
    expected = masker.encode_conversations([(completion_messages(by_id[i]), None) for i in ds["id"]])
    for row, enc in zip(ds, expected):
        assert row["input_ids"] == enc.input_ids
        assert row["loss_mask"] == enc.loss_mask.tolist()
        assert row["length"] == len(enc.input_ids) <= POLICY.max_length
        assert row["source"] == by_id[row["id"]]["source"]
    assert len(ds) == metrics["samples"]
    assert sorted((out / "dataset").glob("data-*.arrow"))  # sharded by shard_size
    assert not (out / "_work").exists()


def test_drops_are_counted_by_reason(tokenized, records):
    out, m = tokenized
    ids = set(load_from_disk(str(out / "dataset"))["id"])
    assert {"s000010", "s000011", "s000012"}.isdisjoint(ids)
    assert m["samples_in"] == len(records)
    assert m["dropped_by_reason"]["generation_error"] == 1
    assert m["dropped_by_reason"]["few_loss_tokens"] >= 1
    assert m["dropped_by_reason"]["too_long"] >= 1
    assert m["dropped"] == sum(m["dropped_by_reason"].values()) == len(records) - m["samples"]
    per = m["per_source"]
    assert sum(s["samples"] for s in per.values()) == m["samples"]
    assert sum(s["tokens"] for s in per.values()) == m["tokens"]
    assert sum(s["loss_tokens"] for s in per.values()) == m["loss_tokens"]
    assert sum(s["dropped"] for s in per.values()) == m["dropped"]
    ds = load_from_disk(str(out / "dataset"))
    assert m["tokens"] == sum(ds["length"])
    assert m["loss_tokens"] == sum(sum(x) for x in ds["loss_mask"])


def test_truncate_policy_keeps_the_head_and_its_mask(tmp_path, completions, tok_dir, records):
    policy = TokenizePolicy(max_length=64, overflow="truncate", min_loss_tokens=0)
    m = tokenize_completions(completions, tmp_path, tok_dir, policy)
    ds = load_from_disk(str(tmp_path / "dataset"))
    assert m["dropped_by_reason"] == {"too_long": 0, "few_loss_tokens": 0, "generation_error": 1}
    assert max(ds["length"]) == 64
    row = ds[next(i for i, x in enumerate(ds["id"]) if x == "s000012")]
    full = ChatMasker.from_path(tok_dir).encode_conversations([(completion_messages(records[12]), None)])[0]
    assert row["input_ids"] == full.input_ids[:64] and row["loss_mask"] == full.loss_mask[:64].tolist()


def test_num_proc_2_gives_the_same_dataset(tmp_path, tokenized, completions, tok_dir):
    out, metrics = tokenized
    m2 = tokenize_completions(completions, tmp_path, tok_dir, POLICY, num_proc=2, shard_size=100)
    one, two = load_from_disk(str(out / "dataset")), load_from_disk(str(tmp_path / "dataset"))
    assert m2 == metrics
    assert one["id"] == two["id"] and one["input_ids"] == two["input_ids"] and one["loss_mask"] == two["loss_mask"]


def test_thinking_flag_reaches_the_template(tmp_path, tok_dir):
    rec = {"id": "a", "source": "s", "messages": [{"role": "user", "content": "hi"}], "reasoning": "",
           "answer": "OK.", "finish_reason": "stop"}
    write_jsonl_atomic(shard_path(tmp_path / "c", 0), [rec])
    tok = ChatMasker.from_path(tok_dir).tokenizer
    loss = {}
    for thinking in (True, False):
        tokenize_completions(tmp_path / "c", tmp_path / str(thinking), tok_dir,
                             TokenizePolicy(max_length=64), enable_thinking=thinking)
        row = load_from_disk(str(tmp_path / str(thinking) / "dataset"))[0]
        loss[thinking] = tok.decode(np.asarray(row["input_ids"])[np.asarray(row["loss_mask"]) == 1])
    assert loss == {True: "<think>\n\n</think>\n\nOK.<|im_end|>", False: "OK.<|im_end|>"}


def test_missing_input_is_a_clear_error(tmp_path, tok_dir):
    with pytest.raises(FileNotFoundError, match="no completion shards"):
        tokenize_completions(tmp_path / "empty", tmp_path / "out", tok_dir, POLICY)


def test_stage_run_reads_the_recipe(tmp_path, completions, tok_dir):
    from dflashx.stages.tokenize import run
    from helpers_models import make_recipe, stage_context

    recipe = make_recipe(
        target={"model": str(tok_dir), "tokenizer": str(tok_dir), "precision": "fp32"},
        drafter={"block_size": 8},
        stages={"tokenize": {"max_length": 128, "overflow": "drop", "min_loss_tokens_blocks": 2, "num_proc": 1}},
    )
    logged = []
    ctx = stage_context("tokenize", recipe, tmp_path, {"generate.completions": completions},
                        log=lambda m, step=None: logged.append(m))
    result = run(ctx)
    assert result.artifacts["dataset"].path == "dataset"
    ds = load_from_disk(str(ctx.out_dir / "dataset"))
    assert len(ds) == result.metrics["samples"] > 0
    assert max(ds["length"]) <= 128 and min(sum(m) for m in ds["loss_mask"]) >= 16
    assert logged and logged[0]["tokenize/tokens"] == result.metrics["tokens"]
    from dflashx.data import chat_contract  # the contract train checks the dataset against

    assert chat_contract.read(ctx.out_dir / "dataset") == chat_contract.recipe_contract(ctx.recipe.target)
