"""The in-process transformers backend on a tiny Qwen3 target (2 layers, hidden 64) on the CPU.

The target is overfit on two conversations so that greedy decoding of their prompts reproduces a
known `<think>...</think>` + answer: that checks the split, the stop/length reasons, the token
counts and that left padding in a batch changes nothing.
"""

from __future__ import annotations

import pytest
import torch
from helpers_models import memorize, tiny_target

from dflashx.backends.transformers_local import TransformersBackend
from dflashx.config.schema import ChatTemplateSpec, GenerateStage

CONVERSATIONS = [
    [{"role": "user", "content": "What is 12 plus 30?"},
     {"role": "assistant", "reasoning_content": "Add the tens.", "content": "The answer is 42."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Sort 5 3 9 1."},
     {"role": "assistant", "reasoning_content": "Smallest first.", "content": "1 3 5 9"}],
]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    torch.set_num_threads(1)
    path = tiny_target(tmp_path_factory.mktemp("tiny") / "target")
    memorize(path, CONVERSATIONS)
    return path


def prompts() -> list[dict]:
    return [{"id": f"c{i}", "source": "t", "messages": conv[:-1]} for i, conv in enumerate(CONVERSATIONS)]


def run_backend(target, **kw) -> tuple[TransformersBackend, dict[str, dict]]:
    cfg = GenerateStage(backend="transformers", temperature=0.0, **{"max_tokens": 40, "batch_size": 2, **kw})
    backend = TransformersBackend(target, target, cfg, ChatTemplateSpec(enable_thinking=True))
    out: list[dict] = []
    with backend:
        backend.generate(prompts(), out.append)
    return backend, {r["id"]: r for r in out}


def test_greedy_batch_reproduces_reasoning_and_answer(target):
    backend, out = run_backend(target)
    for i, conv in enumerate(CONVERSATIONS):
        r = out[f"c{i}"]
        assert r["reasoning"] == conv[-1]["reasoning_content"]
        assert r["answer"] == conv[-1]["content"]
        assert r["finish_reason"] == "stop" and r["backend"] == "transformers"
        assert r["messages"] == conv[:-1] and r["source"] == "t"
    tok = backend.tokenizer
    for i, conv in enumerate(CONVERSATIONS):
        full = tok.apply_chat_template(conv, tokenize=False)
        prompt = tok.apply_chat_template(conv[:-1], tokenize=False, add_generation_prompt=True)
        n_full = len(tok(full.rstrip("\n"), add_special_tokens=False)["input_ids"])
        n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
        assert out[f"c{i}"]["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": n_full - n_prompt}


def test_batch_of_one_gives_the_same_text_as_a_padded_batch(target):
    _, single = run_backend(target, batch_size=1)
    _, batched = run_backend(target, batch_size=2)
    assert single == batched


def test_max_tokens_cut_is_reported_as_length(target):
    _, out = run_backend(target, max_tokens=4)
    for r in out.values():
        assert r["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 4
        assert r["answer"] == "" and r["reasoning"] != ""  # cut inside the think block
