"""Stage keys: sha256 over the recipe keys that decide a stage's output and its inputs' sha256.

The material hashed (canonical JSON, sorted keys) is
    {"version": KEY_VERSION, "stage": name,
     "config": {dotted section: value from the plan's `resolved` recipe, minus `ignore` keys and
                the stage's `enabled` switch; local paths replaced by their content fingerprint},
     "inputs": {"<stage>.<artifact>": sha256 from the manifest}}
so changing `stages.train.lr` changes only train's key; eval and export follow when the new
checkpoint's sha256 differs. Hardware never enters a key.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflashx.run.graph import GRAPH
from dflashx.store.hashing import fingerprint
from dflashx.tiny import BUILTIN_PREFIX, builtin_identity
from dflashx.store.manifest import Manifest

KEY_VERSION = 1
_MISSING = object()


@dataclass
class StageKey:
    key: str
    inputs: dict[str, str | None] = field(default_factory=dict)  # name -> sha256 (present inputs)
    missing: list[str] = field(default_factory=list)  # required inputs absent from the manifest


def _get(data: Any, parts: list[str]) -> Any:
    for part in parts:
        if not isinstance(data, dict) or part not in data:
            return _MISSING
        data = data[part]
    return data


def _apply(data: Any, parts: list[str], change: Any) -> None:
    """Call `change(container, key)` on the item at `parts` (a part ending in `[]` maps over a list)."""
    if not parts or not isinstance(data, dict):
        return
    head, rest = parts[0], parts[1:]
    if head.endswith("[]"):
        for item in data.get(head[:-2]) or []:
            _apply(item, rest, change)
    elif not rest:
        if head in data:
            change(data, head)
    else:
        _apply(data.get(head), rest, change)


def _drop(container: dict[str, Any], key: str) -> None:
    del container[key]


def _fingerprint_path(container: dict[str, Any], key: str) -> None:
    value = container[key]
    if isinstance(value, str) and value.startswith(BUILTIN_PREFIX):
        container[key] = {"builtin": builtin_identity(value)}
    elif isinstance(value, str) and Path(value).exists():
        container[key] = {"fingerprint": fingerprint(value)}


def _relative(section: str, dotted: str) -> list[str] | None:
    """`dotted` as parts under the root key `section` (None when it is not under it)."""
    if dotted == section:
        return [section]
    for sep, head in ((f"{section}[].", f"{section}[]"), (f"{section}.", section)):
        if dotted.startswith(sep):
            return [head, *dotted[len(sep):].split(".")]
    return None


def key_material(stage: str, resolved: dict[str, Any], inputs: dict[str, str | None]) -> dict[str, Any]:
    """What a stage's key hashes (see the module docstring)."""
    spec = GRAPH[stage]
    config: dict[str, Any] = {}
    for section in spec.sections:
        value = _get(resolved, section.split("."))
        config[section] = None if value is _MISSING else copy.deepcopy(value)
    for section in spec.sections:
        for dotted, change in [*((d, _drop) for d in (*spec.ignore, f"stages.{stage}.enabled")),
                               *((d, _fingerprint_path) for d in spec.paths)]:
            parts = _relative(section, dotted)
            if parts:
                _apply(config, parts, change)
    return {"version": KEY_VERSION, "stage": stage, "config": config, "inputs": dict(sorted(inputs.items()))}


def stage_inputs(stage: str, manifest: Manifest) -> tuple[dict[str, str | None], list[str]]:
    """(present inputs -> sha256, missing required inputs) from the manifest's live entries."""
    spec = GRAPH[stage]
    live = {e.name: e.sha256 for e in manifest.live()}
    if spec.all_inputs:
        return {n: sha for n, sha in live.items() if not n.startswith(f"{stage}.")}, []
    present = {n: live[n] for n in (*spec.inputs, *spec.optional_inputs) if n in live}
    return present, [n for n in spec.inputs if n not in live]


def stage_key(stage: str, resolved: dict[str, Any], manifest: Manifest) -> StageKey:
    """The stage's key now, from the plan's resolved recipe and the manifest."""
    inputs, missing = stage_inputs(stage, manifest)
    material = json.dumps(key_material(stage, resolved, inputs), sort_keys=True, separators=(",", ":"), default=str)
    return StageKey(hashlib.sha256(material.encode()).hexdigest(), inputs, missing)
