"""Where a recipe's target and tokenizer load from: builtin, local folder, hub id, and bad values."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from dflashx.config.schema import TargetSpec
from dflashx.targets.locate import TargetPathError, locate_target, locate_tokenizer
from dflashx.tiny import build, locate_builtin


def test_local_folder_resolves_to_itself(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert locate_target(TargetSpec(model=str(tmp_path))) == tmp_path
    assert locate_tokenizer(TargetSpec(model=str(tmp_path))) == tmp_path


def test_separate_tokenizer_folder(tmp_path):
    model, tok = tmp_path / "m", tmp_path / "t"
    model.mkdir(), tok.mkdir()
    (model / "config.json").write_text("{}")
    assert locate_tokenizer(TargetSpec(model=str(model), tokenizer=str(tok))) == tok


def test_hub_id_is_passed_through_for_from_pretrained():
    assert str(locate_target(TargetSpec(model="Qwen/Qwen3-8B"))) == "Qwen/Qwen3-8B"


@pytest.mark.parametrize("value", ["./missing/model", "/no/such/folder", "a/b/c"])
def test_missing_local_paths_name_the_key_and_the_fix(value):
    with pytest.raises(TargetPathError, match=r"target.model: .*fix the path"):
        locate_target(TargetSpec(model=value))


def test_folder_without_config_is_refused(tmp_path):
    with pytest.raises(TargetPathError, match=r"has no config\.json"):
        locate_target(TargetSpec(model=str(tmp_path)))


def test_builtin_prompt_file_is_not_a_target():
    with pytest.raises(TargetPathError, match="not a built-in target"):
        locate_target(TargetSpec(model="builtin:tiny-prompts"))


def test_builtin_target_resolves_to_its_cache_folder_without_rebuilding(tmp_path, monkeypatch):
    """A cache entry with the right key is taken as built (the build itself is in test_tiny_build)."""
    monkeypatch.setenv("DFLASHX_CACHE", str(tmp_path))
    monkeypatch.setenv("DFLASHX_TINY_SIZE", "small")
    settings = build.BuildSettings.for_variant("tiny-qwen3_5", small=True)
    key = build.build_key(settings)
    folder = tmp_path / "tiny" / f"tiny-qwen3_5-small-{key}"
    folder.mkdir(parents=True)
    (folder / "build_report.json").write_text(json.dumps({"key": key}))
    assert locate_target(TargetSpec(model="builtin:tiny-qwen3_5")) == folder
    assert locate_builtin("builtin:tiny-qwen3_5") == folder


def test_unknown_tiny_size_is_an_error(monkeypatch):
    monkeypatch.setenv("DFLASHX_TINY_SIZE", "huge")
    with pytest.raises(ValueError, match="DFLASHX_TINY_SIZE"):
        locate_builtin("builtin:tiny-qwen3")


def test_build_key_changes_with_settings():
    base = build.BuildSettings.for_variant("tiny-qwen3")
    assert build.build_key(base) == build.build_key(build.BuildSettings.for_variant("tiny-qwen3"))
    assert build.build_key(base) != build.build_key(build.BuildSettings.for_variant("tiny-qwen3", small=True))
    assert build.build_key(base) != build.build_key(build.BuildSettings.for_variant("tiny-qwen3_5"))


def test_builtin_tokenizer_resolves_without_building_the_model(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    monkeypatch.setenv("DFLASHX_CACHE", str(tmp_path))
    monkeypatch.setenv("DFLASHX_TINY_SIZE", "small")
    folder = locate_tokenizer(TargetSpec(model="builtin:tiny-qwen3"))
    assert (folder / "tokenizer.json").is_file() and not (folder / "model.safetensors").exists()
    assert AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids("<|mask|>") == build.MASK_TOKEN_ID
    assert not list((tmp_path / "tiny").glob("tiny-qwen3*")), "the model must not be built"
    assert locate_tokenizer(TargetSpec(model="builtin:tiny-qwen3")) == folder


def test_a_shipped_builtins_tokenizer_is_its_model_folder_copied_not_trained(tmp_path, monkeypatch):
    """Full size, the build shipped under the current key: the tokenizer is the shipped model folder's (a copy),
    byte for byte the tokenizer a tokenizer-only build trains (seconds of CPU saved at preflight)."""
    from transformers import AutoTokenizer

    from dflashx.tiny import shipped

    monkeypatch.setenv("DFLASHX_CACHE", str(tmp_path))
    assert shipped.record("tiny-qwen3")["key"] == build.build_key(build.BuildSettings.for_variant("tiny-qwen3"))
    folder = locate_tokenizer(TargetSpec(model="builtin:tiny-qwen3"))
    assert folder == locate_target(TargetSpec(model="builtin:tiny-qwen3"))  # the model folder, copied
    assert not list((tmp_path / "tiny").glob("tokenizer-*")), "no tokenizer trained"
    assert AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids("<|mask|>") == build.MASK_TOKEN_ID
    trained = build.ensure_tiny_tokenizer("tiny-qwen3")
    assert (trained / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    assert (trained / "chat_template.jinja").read_bytes() == (folder / "chat_template.jinja").read_bytes()


def test_concurrent_builds_of_one_folder_build_once(tmp_path):
    """A second builder waits on the lock and takes the first one's folder (no second training)."""
    calls: list[int] = []

    def fill(tmp: Path) -> None:
        calls.append(1)
        time.sleep(0.3)
        (tmp / "build_report.json").write_text(json.dumps({"key": "k1"}))

    dest, results = tmp_path / "tiny-qwen3-k1", []
    threads = [threading.Thread(target=lambda: results.append(build._build_atomically(dest, "k1", fill, print)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1] and results == [dest] * 3
    assert json.loads((dest / "build_report.json").read_text())["key"] == "k1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-qwen3-k1"]  # no temporary folder, no lock file
