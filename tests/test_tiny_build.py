"""Build the small tiny targets for real (CPU) and use them like any Hugging Face target."""

from __future__ import annotations

import ast
import hashlib
import json
import random
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dflashx.tiny import corpus, train
from dflashx.tiny.build import MASK_TOKEN_ID, ensure_tiny_target, ensure_tiny_tokenizer, model_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def built(cache):
    """The small tiny-qwen3 built once for this module into a private cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("DFLASHX_CACHE", str(cache))
    torch.set_num_threads(1)
    logs: list[str] = []
    path = ensure_tiny_target("tiny-qwen3", small=True, log=logs.append)
    yield path, logs
    mp.undo()


def test_build_writes_a_standard_hf_folder(built, cache):
    path, _ = built
    assert path.parent == cache / "tiny" and path.name.startswith("tiny-qwen3-small-")
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "build_report.json"):
        assert (path / name).is_file(), name
    config = json.loads((path / "config.json").read_text())
    expected = model_config("tiny-qwen3", small=True)
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        assert config[key] == expected[key]
    report = json.loads((path / "build_report.json").read_text())
    assert report["mask_token_id"] == MASK_TOKEN_ID
    assert set(report["eval_thinking"]["per_family"]) == set(corpus.FAMILIES)
    assert not list(cache.glob("tiny/.*")), "temporary build folder left behind"
    tokenizer_only = ensure_tiny_tokenizer("tiny-qwen3", small=True)
    assert (tokenizer_only / "tokenizer.json").read_bytes() == (path / "tokenizer.json").read_bytes()


def test_greedy_answers_to_held_out_prompts_are_well_formed(built):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, _ = built
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.convert_tokens_to_ids("<|mask|>") == MASK_TOKEN_ID
    held_out = corpus.examples("eval", 24, seed=0)
    rng = random.Random(7)
    prompts = [train.prompt_text(tok, corpus.to_messages(ex, rng), True) for ex in held_out]
    replies = [train.parse_reply(t, True) for t in train.generate(model, tok, prompts, 160)]
    formed = [r for r in replies if r.well_formed]
    assert len(formed) >= 0.7 * len(replies), [r.answer for r in replies]


def test_second_build_hits_the_cache(built):
    path, _ = built
    before = (path / "model.safetensors").stat().st_mtime_ns
    logs: list[str] = []
    assert ensure_tiny_target("tiny-qwen3", small=True, log=logs.append) == path
    assert logs == [f"cached: {path}"]
    assert (path / "model.safetensors").stat().st_mtime_ns == before


def test_cli_build_tiny_into_out_and_info(built, tmp_path):
    from dflashx.cli.target import app

    path, _ = built
    runner = CliRunner()
    # --out at the already built folder: found by its key, not rebuilt.
    result = runner.invoke(app, ["build-tiny", "--small", "--out", str(path)])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == str(path) and "cached" in result.output
    result = runner.invoke(app, ["info", str(path)])
    assert result.exit_code == 0, result.output
    assert '"num_layers": 6' in result.output and "eval_thinking: accuracy" in result.output
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "x.txt").write_text("mine")
    result = runner.invoke(app, ["build-tiny", "--small", "--out", str(occupied)])
    assert result.exit_code == 1 and "holds no build" in result.output
    assert runner.invoke(app, ["build-tiny", "--variant", "tiny-llama"]).exit_code == 2


def test_gated_deltanet_variant_builds_and_generates(cache, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("DFLASHX_CACHE", str(cache))
    torch.set_num_threads(1)
    path = ensure_tiny_target("tiny-qwen3_5", small=True)
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_text"
    assert {"linear_attention", "full_attention"} == set(config["layer_types"])
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    prompt = train.prompt_text(tok, [{"role": "user", "content": corpus.examples("eval", 1, 0)[0].user}], True)
    text = train.generate(model, tok, [prompt], 48)[0]
    assert text.startswith("<think>")  # the hybrid model learned the format's first step at least


def _other_pythons() -> list[str]:
    """Interpreters of the supported versions found on this machine (pyenv's or the system's)."""
    import glob
    import subprocess

    found = {}
    for exe in sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.1[123]*/bin/python3"))
                      + glob.glob("/usr/bin/python3.1[123]")):
        version = subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                                 text=True).stdout.strip()
        found.setdefault(version, exe)
    return list(found.values())


def test_the_build_key_is_the_same_on_every_supported_python():
    """The shipped tiny target is used on Python 3.11 to 3.13 alike (Ubuntu 24.04's is 3.12, Debian 13's
    3.13): each interpreter computes the same key from the build modules' syntax trees. Only the
    standard library runs there (syntax_text read out of build.py), so no dflashx install is needed."""
    import subprocess

    import dflashx.tiny.build as build

    pythons = _other_pythons()
    if len(pythons) < 2:
        pytest.skip("fewer than two of Python 3.11-3.13 on this machine")
    script = (
        "import ast, hashlib, sys\n"
        "from typing import Any\n"
        f"folder = {str(Path(build.__file__).parent)!r}\n"
        "tree = ast.parse(open(folder + '/build.py').read())\n"
        "fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == 'syntax_text')\n"
        "ns = {'ast': ast, 'Any': Any}\n"
        "exec(compile(ast.Module([fn], []), 'build.py', 'exec'), ns)\n"
        f"for name in {build._BUILD_SOURCES!r}:\n"
        "    print(hashlib.sha256(ns['syntax_text'](ast.parse(open(folder + '/' + name).read())).encode())"
        ".hexdigest())\n"
    )
    mine = [hashlib.sha256(build.syntax_text(ast.parse((Path(build.__file__).parent / n).read_text())).encode())
            .hexdigest() for n in build._BUILD_SOURCES]
    for exe in pythons:
        out = subprocess.run([exe, "-c", script], capture_output=True, text=True, check=True).stdout.split()
        assert out == mine, exe
