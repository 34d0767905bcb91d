"""Deterministic artifacts: the same completions give byte-identical `tokenize.dataset` and
`qc.report` folders (and so the same manifest sha256 and downstream keys), whichever run folder
they are made in, whenever the completions were written."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from datasets import load_from_disk

from dflashx.config.schema import Recipe
from dflashx.data.jsonl import shard_path, write_jsonl_atomic
from dflashx.dflash.data import load_token_dataset
from dflashx.stages.base import StageContext, StageFailed
from dflashx.store.manifest import Manifest
from helpers_models import make_recipe, stage_context
from helpers_tokenizer import tokenizer_dir
from test_qc import healthy, seed_failure

RUN_DIRS = ("first/runs/tiny", "elsewhere/tiny")  # two run folders under different parents
COMPLETIONS = "generate.completions"


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return tokenizer_dir(str(tmp_path_factory.mktemp("tok")))


def recipe_for(tok_dir: Path, **stages) -> Recipe:
    return make_recipe(target={"model": str(tok_dir), "tokenizer": str(tok_dir), "precision": "fp32"},
                       drafter={"block_size": 8}, stages=stages)


def contexts(tmp_path: Path, stage: str, records: list[dict], recipes: tuple) -> list[StageContext]:
    """One StageContext per run folder, each with its own copy of the same completion shards, as
    each run's generate stage writes them (another path, another modification time)."""
    out = []
    for i, (rel, recipe) in enumerate(zip(RUN_DIRS, recipes)):
        run_dir = tmp_path / rel
        completions = run_dir / "generate" / "completions"
        half = len(records) // 2
        for index, part in enumerate((records[:half], records[half:])):
            write_jsonl_atomic(shard_path(completions, index), part)
            os.utime(shard_path(completions, index), (1_700_000_000 + i, 1_700_000_000 + i))
        out.append(stage_context(stage, recipe, run_dir, {COMPLETIONS: completions}))
    return out


def file_sha256s(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_identical_artifacts(ctxs: list[StageContext], stage: str, artifact: str, rel: str) -> None:
    """Same file list, same bytes per file, and the same folder sha256 as the manifest records."""
    first, second = (file_sha256s(ctx.out_dir / rel) for ctx in ctxs)
    assert first and sorted(first) == sorted(second)
    assert [name for name in first if first[name] != second[name]] == []
    entries = [Manifest(ctx.run_dir).register(stage, artifact, ctx.out_dir / rel, "replaceable") for ctx in ctxs]
    assert entries[0].sha256 == entries[1].sha256 is not None
    assert entries[0].files == entries[1].files and set(entries[0].files) == set(first)


@pytest.mark.parametrize("num_procs", [(1, 1), (1, 2)], ids=["same-num-proc", "num-proc-1-vs-2"])
def test_tokenize_dataset_is_byte_identical_across_run_folders(tmp_path, tok_dir, num_procs):
    from dflashx.stages.tokenize import DATASET_DIR, run

    recipes = tuple(recipe_for(tok_dir, tokenize={"max_length": 128, "min_loss_tokens_blocks": 1, "num_proc": n,
                                                  "shard_size": 40}) for n in num_procs)
    ctxs = contexts(tmp_path, "tokenize", healthy(120), recipes)
    results = [run(ctx) for ctx in ctxs]
    assert results[0].metrics == results[1].metrics and results[0].metrics["samples"] > 40
    assert_identical_artifacts(ctxs, "tokenize", "dataset", DATASET_DIR)
    folders = [ctx.out_dir / DATASET_DIR for ctx in ctxs]
    assert len(list(folders[0].glob("data-*.arrow"))) > 1  # several shards, each compared
    loaded = [load_from_disk(str(f)) for f in folders]
    assert loaded[0]._fingerprint == loaded[1]._fingerprint
    assert loaded[0]["input_ids"] == loaded[1]["input_ids"] and loaded[0]["id"] == loaded[1]["id"]
    train_view = load_token_dataset(folders[1])
    assert len(train_view) == results[1].metrics["samples"] and train_view.column_names == ["input_ids",
                                                                                           "loss_mask", "length"]


def test_tokenize_fingerprint_follows_the_content(tmp_path, tok_dir):
    """The `_fingerprint` in state.json is the content's: the same samples tokenized in two run
    folders share it, other samples (a shorter max_length) get another one."""
    from dflashx.stages.tokenize import DATASET_DIR, TokenizePolicy, tokenize_completions

    recipe = recipe_for(tok_dir)
    first, second = contexts(tmp_path, "tokenize", healthy(60), (recipe, recipe))
    prints = {}
    for ctx, max_length, out in ((first, 128, "a"), (second, 128, "b"), (second, 64, "c")):
        tokenize_completions(ctx.inputs[COMPLETIONS], ctx.out_dir / out, tok_dir, TokenizePolicy(max_length=max_length))
        prints[out] = json.loads((ctx.out_dir / out / DATASET_DIR / "state.json").read_text())["_fingerprint"]
    assert prints["a"] == prints["b"] != prints["c"]


@pytest.mark.parametrize("records, passes", [(healthy, True), (seed_failure, False)], ids=["passing", "failing"])
def test_qc_report_is_byte_identical_across_run_folders(tmp_path, tok_dir, records, passes):
    from dflashx.stages.qc import REPORT_DIR, run

    recipe = recipe_for(tok_dir)
    ctxs = contexts(tmp_path, "qc", records(), (recipe, recipe))
    for ctx in ctxs:
        if passes:
            assert run(ctx).metrics["passed"] is True
        else:
            with pytest.raises(StageFailed):
                run(ctx)
    assert_identical_artifacts(ctxs, "qc", "report", REPORT_DIR)
    report = (ctxs[0].out_dir / REPORT_DIR / "report.md").read_text()
    assert "Input: `generate/completions`" in report and str(tmp_path) not in report
    assert json.loads((ctxs[0].out_dir / REPORT_DIR / "qc.json").read_text())["path"] == "generate/completions"
    for png in (ctxs[0].out_dir / REPORT_DIR).glob("*.png"):
        assert b"tEXt" not in png.read_bytes() and b"Matplotlib" not in png.read_bytes()
