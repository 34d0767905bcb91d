"""The figures of a `dflashx plan --json --explain` document: every number, keyed by its path.

Lists are keyed by their items' `key` (explained terms) or `name` (stages, sources), else by index, so a
figure keeps its path when the explanation changes form. Text, booleans and nulls are not figures.
Used by tests/test_plan_golden.py and, once, to write qwen36_27b.f5ac536.json from f5ac536's output.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def figures(document: Any, path: str = "") -> Iterator[tuple[str, float]]:
    if isinstance(document, dict):
        for key, value in document.items():
            yield from figures(value, f"{path}.{key}" if path else str(key))
    elif isinstance(document, list):
        for i, item in enumerate(document):
            name = (item.get("key") or item.get("name")) if isinstance(item, dict) else None
            yield from figures(item, f"{path}[{name if name else i}]")
    elif isinstance(document, (int, float)) and not isinstance(document, bool):
        yield path, float(document)
