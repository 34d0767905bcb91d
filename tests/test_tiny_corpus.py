"""The tiny corpus: seeded, exact, split by problem, both thinking modes; the prompt files."""

from __future__ import annotations

import json
import random
import re

import pytest

from dflashx.tiny import corpus, prompts, locate_builtin


def test_examples_are_seeded_and_cover_every_family_in_turn():
    a, b = corpus.examples("train", 60, seed=3), corpus.examples("train", 60, seed=3)
    assert a == b
    assert a != corpus.examples("train", 60, seed=4)
    assert [ex.family for ex in a[:6]] == list(corpus.FAMILIES)


def test_held_out_problems_never_reach_training():
    train_keys = {ex.key for ex in corpus.examples("train", 3000, 0)}
    eval_keys = {ex.key for ex in corpus.examples("eval", 120, 0)}
    prompt_keys = {ex.key for ex in corpus.examples("prompts", 300, 0)}
    assert len(eval_keys) == 120 and len(prompt_keys) == 300
    assert not train_keys & eval_keys and not train_keys & prompt_keys and not eval_keys & prompt_keys


def _numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", text)]


@pytest.mark.parametrize("i", range(40))
def test_reasoning_and_answers_are_exact(i):
    rng = random.Random(i)
    for name, make in corpus.FAMILIES.items():
        ex = make(rng)
        assert ex.family == name and ex.reasoning and ex.answer
        if name == "add":
            a, b, total = _numbers(ex.answer)
            assert a + b == total and ex.reasoning.endswith(f"Result: {total}")
        elif name == "sort":
            assert _numbers(ex.answer) == sorted(_numbers(ex.user))
        elif name == "reverse":
            items = [i.split(" ", 1)[1] for i in ex.user.split(": ", 1)[1].split(", ")]
            assert ex.answer == f"Reversed: {', '.join(items[::-1])}."
        elif name == "convert":
            value, result = _numbers(ex.answer)
            assert result == value * int(ex.reasoning.split(" = ")[1].split()[0])
        elif name == "count":
            letter, word = re.search(r"letter (\w) .*\"(\w+)\"", ex.user).groups()
            assert _numbers(ex.answer) == [word.count(letter)]
        elif name == "case":
            snake = re.search(r"\b([a-z]+(?:_[a-z]+)+)\b", ex.user).group(1)
            head, *rest = snake.split("_")
            assert ex.answer == f"In camelCase: {head}{''.join(w.title() for w in rest)}."


def test_thinking_off_turns_have_empty_reasoning():
    ex = corpus.examples("train", 1, 0)[0]
    on = corpus.to_messages(ex, random.Random(0), thinking=True)
    off = corpus.to_messages(ex, random.Random(0), thinking=False)
    assert on[-1]["reasoning_content"] == ex.reasoning and off[-1]["reasoning_content"] == ""
    assert on[-1]["content"] == off[-1]["content"] == ex.answer


def test_builtin_prompt_files(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASHX_CACHE", str(tmp_path))
    gen = [json.loads(line) for line in locate_builtin("builtin:tiny-prompts").read_text().splitlines()]
    held = [json.loads(line) for line in locate_builtin("builtin:tiny-eval-prompts").read_text().splitlines()]
    assert len(gen) == prompts.PROMPT_FILES["tiny-prompts"][1]
    assert len(held) == prompts.PROMPT_FILES["tiny-eval-prompts"][1]
    for row in gen + held:
        assert set(row) >= {"id", "source", "messages", "family"}
        assert [m["role"] for m in row["messages"]] in (["user"], ["system", "user"])
    assert all("answer" not in r for r in gen) and all(r["answer"] for r in held)
    assert not {r["messages"][-1]["content"] for r in gen} & {r["messages"][-1]["content"] for r in held}
    assert {r["family"] for r in held[:6]} == set(corpus.FAMILIES)
    # A second resolve returns the same file untouched.
    path = locate_builtin("builtin:tiny-prompts")
    mtime = path.stat().st_mtime_ns
    assert locate_builtin("builtin:tiny-prompts") == path and path.stat().st_mtime_ns == mtime


def test_unknown_builtin_names_the_known_ones():
    with pytest.raises(ValueError, match="builtin:tiny-eval-prompts"):
        locate_builtin("builtin:tiny-nothing")
