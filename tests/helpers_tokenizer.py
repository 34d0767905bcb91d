"""Shared test builders: a locally trained Qwen3-style tokenizer and synthetic conversations."""

from __future__ import annotations

import random
from functools import lru_cache
from pathlib import Path
from typing import Any

WORDS = (  # noqa: SIM905 (a word list reads best as one string)
    "the of and to in is that for it as with was on be by this are or from at an which have not "
    "had but what all were when we there can more if has will one about so some them would other "
    "into than then its only two time these may first new like very also any after could see out "
    "way each over most know think step answer therefore compute value number check wait let "
    "first second sum total carry digit so result because"
).split()
PUNCT = [".", ",", "?", "!", ":", "\n", "\n\n", " (", ")"]


def random_text(rng: random.Random, words: int) -> str:
    """Word soup with punctuation, newlines and numbers (realistic pre-tokenizer boundaries)."""
    out = []
    for _ in range(words):
        r = rng.random()
        out.append(str(rng.randint(0, 9999)) if r < 0.08 else rng.choice(WORDS))
        if r > 0.85:
            out.append(rng.choice(PUNCT))
    return " ".join(out).replace(" \n", "\n").strip()


def corpus(n: int = 2000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [random_text(rng, 120) for _ in range(n)]


@lru_cache(maxsize=4)
def tokenizer_dir(root: str, vocab_size: int = 2048) -> Path:
    """Train (once per root) and save the test tokenizer; returns its folder."""
    from dflashx.tiny.tokenizer import train_tokenizer

    out = Path(root) / f"tok{vocab_size}"
    if not (out / "tokenizer.json").exists():
        train_tokenizer(corpus(), vocab_size=vocab_size, out_dir=out)
    return out


def random_conversation(rng: random.Random, turns: int = 1, system: bool = True,
                        reasoning_words: tuple[int, int] = (5, 60)) -> list[dict[str, Any]]:
    """A conversation ending with an assistant turn; earlier assistant turns carry reasoning."""
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": random_text(rng, rng.randint(3, 12))})
    for _ in range(turns):
        messages.append({"role": "user", "content": random_text(rng, rng.randint(3, 40))})
        messages.append({
            "role": "assistant",
            "content": random_text(rng, rng.randint(1, 40)),
            "reasoning_content": random_text(rng, rng.randint(*reasoning_words)),
        })
    return messages


def completion_record(rng: random.Random, i: int, source: str = "src", reasoning: str | None = None,
                      answer: str | None = None, finish_reason: str = "stop") -> dict[str, Any]:
    """A generate-stage completion record (docs/design.md shape)."""
    return {
        "id": f"s{i:06d}",
        "source": source,
        "messages": [{"role": "user", "content": random_text(rng, rng.randint(3, 30))}],
        "reasoning": random_text(rng, rng.randint(20, 80)) if reasoning is None else reasoning,
        "answer": random_text(rng, rng.randint(5, 40)) if answer is None else answer,
        "finish_reason": finish_reason,
        "usage": {"prompt_tokens": 10, "completion_tokens": 50},
        "backend": "transformers",
    }
