"""Held-out prompt files of the tiny corpus: generation prompts and evaluation prompts (JSONL).

Records follow the pipeline's prompt shape, `{"id", "source", "messages": [system?, user]}`, plus the
task `family`; evaluation records also carry the reference `answer` sentence. Both sets are drawn from
problems that the tiny target never saw in training (`corpus.split_of`) and are disjoint from each
other. Families come in turn, so the first k records of a file cover every family evenly.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from dflashx.tiny import corpus
from dflashx.store.atomic import atomic_open

PROMPT_FILES: dict[str, tuple[corpus.Split, int, str]] = {
    # builtin name: (split, records, file name)
    "tiny-prompts": ("prompts", 300, "tiny-prompts.jsonl"),
    "tiny-eval-prompts": ("eval", 96, "tiny-eval-prompts.jsonl"),
}


def records(split: corpus.Split, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """`n` prompt records of a held-out split; `answer` is the reference answer sentence."""
    rng = random.Random(f"messages:{split}:{seed}")
    out = []
    for i, ex in enumerate(corpus.examples(split, n, seed)):
        messages = [m for m in corpus.to_messages(ex, rng) if m["role"] != "assistant"]
        out.append({"id": f"tiny-{split}-{i:04d}", "source": f"tiny/{ex.family}", "family": ex.family,
                    "messages": messages, "answer": ex.answer})
    return out


def write_prompt_file(name: str, folder: Path) -> Path:
    """Write the builtin prompt file `name` into `folder` (atomically) unless it is there; return it."""
    split, n, file_name = PROMPT_FILES[name]
    path = folder / file_name
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    rows = records(split, n)
    if split != "eval":
        for row in rows:
            row.pop("answer")
    with atomic_open(path) as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return path
