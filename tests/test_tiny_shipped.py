"""The tiny target shipped inside the package: its files match their record, the record's build key
is the current build code's (a change to the build modules must re-ship), a fresh cache is filled
from it in seconds, and the shipped model still thinks: >= 70% of held-out problems right with
thinking on, every reply well-formed."""

from __future__ import annotations

import json
import time

import pytest

from dflashx.tiny import corpus, shipped, train
from dflashx.tiny.build import BuildSettings, build_key, ensure_tiny_target

VARIANT = "tiny-qwen3"


def test_shipped_files_match_their_record():
    assert shipped.verify(VARIANT) == []


def test_the_shipped_build_is_the_current_build_code():
    """Fails when dflashx/tiny/{build,corpus,tokenizer,train}.py change without re-shipping
    (`python -m dflashx.tiny.reship`)."""
    assert shipped.record(VARIANT)["key"] == build_key(BuildSettings.for_variant(VARIANT, False))


def test_an_empty_cache_is_filled_from_the_package(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASHX_CACHE", str(tmp_path))
    t0 = time.perf_counter()
    folder = ensure_tiny_target(VARIANT)
    assert time.perf_counter() - t0 < 60  # a copy and a checksum, not a build
    assert folder.parent == tmp_path / "tiny"
    record = shipped.record(VARIANT)
    assert sorted(p.name for p in folder.iterdir()) == sorted(record["files"])
    assert json.loads((folder / "build_report.json").read_text())["key"] == record["key"]


def test_a_build_under_another_key_is_not_taken_from_the_package(tmp_path):
    assert shipped.copy_into(VARIANT, "another-key0", tmp_path) is False
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_shipped_model_still_thinks():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = shipped.DATA / VARIANT
    settings = BuildSettings.for_variant(VARIANT, False)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    held_out = corpus.examples("eval", settings.eval_per_family * len(corpus.FAMILIES), settings.seed)
    result = train.evaluate(model, tok, held_out, True, settings.max_new_tokens, settings.seed)["overall"]
    reported = json.loads((folder / "build_report.json").read_text())["eval_thinking"]["overall"]
    assert result["accuracy"] >= 0.70 and result["well_formed"] == 1.0, result
    assert result["accuracy"] == pytest.approx(reported["accuracy"], abs=0.05)
