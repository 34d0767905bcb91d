"""Stage keys: sha256 over the recipe values that decide a stage's output and its inputs' sha256.

The material hashed (canonical JSON, sorted keys) is
    {"version": KEY_VERSION, "stage": name,
     "config": {dotted section: its value in the resolved recipe, keeping only the fields whose
                stage-key marker says OUTPUT and replacing PATH fields by what they point to
                (a content fingerprint, or a builtin's build identity)},
     "inputs": {"<stage>.<artifact>": sha256 from the manifest}}
The sections come from `dflashx.stages.graph.GRAPH`; the markers are on the schema fields
(`dflashx.config.fields`). So changing `stages.train.lr` changes only train's key; eval and export
follow when the new checkpoint's sha256 differs. Hardware never enters a key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from dflashx.config.fields import STAGE_KEY, fields_of, marker
from dflashx.resolve.model import ResolvedRecipe
from dflashx.stages.graph import GRAPH
from dflashx.store.hashing import fingerprint
from dflashx.store.manifest import Manifest
from dflashx.targets.locate import builtin_identity, is_builtin

KEY_VERSION = 2
_DROP = object()


@dataclass
class StageKey:
    key: str
    inputs: dict[str, str | None] = field(default_factory=dict)  # name -> sha256 (present inputs)
    missing: list[str] = field(default_factory=list)  # required inputs absent from the manifest


def role(info: FieldInfo) -> str | None:
    """A field's stage-key marker: output, operational or path (None when it has none)."""
    return marker(info, STAGE_KEY)


def _path_identity(value: Any) -> Any:
    if isinstance(value, str) and is_builtin(value):
        return {"builtin": builtin_identity(value)}
    if isinstance(value, str) and Path(value).exists():
        return {"fingerprint": fingerprint(value)}
    return value


def _view(value: Any, kind: str | None) -> Any:
    """What of `value` enters a key, given its field's role."""
    if kind == "operational":
        return _DROP
    if kind == "path":
        return _path_identity(value)
    if isinstance(value, BaseModel):
        fields = fields_of(type(value))
        kept = {name: _view(getattr(value, name), role(info)) for name, info in fields.items()}
        return {name: v for name, v in kept.items() if v is not _DROP}
    if isinstance(value, list):
        return [_view(item, None) for item in value]
    return value


def _section(recipe: ResolvedRecipe, dotted: str) -> Any:
    *parents, last = dotted.split(".")
    owner: Any = recipe
    for part in parents:
        owner = getattr(owner, part)
    if owner is None:
        return None
    return _view(getattr(owner, last), role(type(owner).model_fields[last]))


def key_material(stage: str, recipe: ResolvedRecipe, inputs: dict[str, str | None]) -> dict[str, Any]:
    """What a stage's key hashes (see the module docstring)."""
    config = {section: _section(recipe, section) for section in GRAPH[stage].sections}
    return {"version": KEY_VERSION, "stage": stage, "config": config, "inputs": dict(sorted(inputs.items()))}


def stage_inputs(stage: str, manifest: Manifest) -> tuple[dict[str, str | None], list[str]]:
    """(present inputs -> sha256, missing required inputs) from the manifest's live entries."""
    spec = GRAPH[stage]
    live = {e.name: e.sha256 for e in manifest.live()}
    if spec.all_inputs:
        return {n: sha for n, sha in live.items() if not n.startswith(f"{stage}.")}, []
    present = {n: live[n] for n in (*spec.inputs, *spec.optional_inputs) if n in live}
    return present, [n for n in spec.inputs if n not in live]


def stage_key(stage: str, recipe: ResolvedRecipe, manifest: Manifest) -> StageKey:
    """The stage's key now, from the resolved recipe and the manifest."""
    inputs, missing = stage_inputs(stage, manifest)
    material = json.dumps(key_material(stage, recipe, inputs), sort_keys=True, separators=(",", ":"), default=str)
    return StageKey(hashlib.sha256(material.encode()).hexdigest(), inputs, missing)
