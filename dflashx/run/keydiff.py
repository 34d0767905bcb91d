"""What changed between two attempts of a stage: the "re-runs: stages.train.lr changed" text.

`key_leaves(material)` turns a stage key's material (`dflashx.run.keys.key_material`) into digests
per dotted recipe key and input, which `_STARTED`/`_SUCCESS` keep (`dflashx.run.rundir`);
`changed_keys(old, new)` compares two of them and `why_text` says it in one line.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from dflashx.config.tree import flatten


def _path_identity(node: Any) -> bool:
    """A PATH field's identity (`{builtin}` / `{fingerprint}`) counts as one leaf."""
    return isinstance(node, dict) and set(node) <= {"builtin", "fingerprint"}


def key_leaves(material: dict[str, Any]) -> dict[str, Any]:
    """A key material as {dotted recipe key or `input <name>`: digest of its value}: what
    `_STARTED`/`_SUCCESS` keep to say later which keys changed (digests, so no recipe value,
    secret or not, is written)."""
    leaves: dict[str, Any] = {}
    for section, value in material["config"].items():
        leaves |= flatten(value, section, _path_identity)
    leaves |= {f"input {name}": sha for name, sha in material["inputs"].items()}
    digest = {k: hashlib.sha256(json.dumps(v, sort_keys=True, default=str).encode()).hexdigest()[:16]
              for k, v in leaves.items()}
    return {"version": material["version"], "leaves": digest}


def changed_keys(old: Any, new: dict[str, Any]) -> list[str] | None:
    """The keys whose digests differ between two `key_leaves`; None when `old` is not one."""
    if not isinstance(old, dict) or not isinstance(old.get("leaves"), dict):
        return None
    if old.get("version") != new["version"]:
        return ["the stage key version (dflashx changed what keys hash)"]
    a, b = old["leaves"], new["leaves"]
    return [k for k in dict.fromkeys([*b, *a]) if a.get(k) != b.get(k)]


def why_text(verb: str, changed: list[str] | None) -> str:
    """`re-runs: stages.train.lr changed`, `re-runs: input train.checkpoint changed`, ..."""
    if not changed:
        return f"{verb}: its key changed" + (" (the earlier attempt kept no key digests)" if changed is None else "")
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return f"{verb}: {', '.join(changed[:3])}{more} changed"
