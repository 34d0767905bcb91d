"""Relative paths in a loaded recipe, made absolute against the folder of the file that wrote them
(docs/recipes.md): a base recipe's own folder, an override's working directory.

Public API: `anchor_relative_paths(data, sources)`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dflashx.config.errors import Loc, SourceMap

_PATH_KEYS: tuple[Loc, ...] = (("drafter", "init_from"), ("stages", "eval", "prompts"),
                              ("stages", "generate", "serving", "drafter"))
_MAYBE_LOCAL_KEYS: tuple[Loc, ...] = (("target", "model"), ("target", "tokenizer"))
# Lists whose items' `path` is one (True: only when it looks local; a baseline may be a hub id).
_PATH_LISTS: tuple[tuple[Loc, bool], ...] = ((("dataset", "sources"), False), (("stages", "eval", "suites"), False),
                                             (("stages", "eval", "baselines"), True))


def _parent(data: Any, loc: Loc) -> Any:
    """The container that holds `loc`'s last key, or None where the recipe has no such branch."""
    for part in loc[:-1]:
        if isinstance(data, dict):
            data = data.get(part)
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return None
    return data


def anchor_relative_paths(data: dict[str, Any], sources: SourceMap) -> None:
    """Make relative paths absolute against the folder of the file that wrote them (see docs/recipes.md)."""

    def fix(loc: Loc, base: Path | None = None, only_if_local: bool = False) -> None:
        container = _parent(data, loc)
        value = container.get(loc[-1]) if isinstance(container, dict) else None
        if not isinstance(value, str) or value.startswith("builtin:") or "://" in value:
            return
        if base is None:
            origin = sources.locate(loc)
            base = Path(origin.file).parent if origin and origin.line is not None else Path.cwd()
        path = base / Path(value).expanduser()
        if only_if_local and not (value.startswith(("/", "./", "../", "~")) or path.exists()):
            return  # a hub id such as Qwen/Qwen3.6-27B
        container[loc[-1]] = os.path.normpath(path)

    for items, only_if_local in _PATH_LISTS:
        listed = _parent(data, (*items, 0))
        for i in range(len(listed) if isinstance(listed, list) else 0):
            fix((*items, i, "path"), only_if_local=only_if_local)
    for loc in _PATH_KEYS:
        fix(loc)
    for loc in _MAYBE_LOCAL_KEYS:
        fix(loc, only_if_local=True)
    fix(("storage", "root"), base=Path.cwd())
