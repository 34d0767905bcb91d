"""A composed recipe as plain dicts and lists: merge two files, read and write one dotted key, flatten
a tree to its dotted keys."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dflashx.config.errors import Loc

ABSENT = object()  # what `select` returns where the tree has no such key


def merge(base: Any, over: Any) -> Any:
    """`over` on top of `base`: mappings merge key by key (over's keys win), anything else —
    lists included — is replaced. Neither input is modified."""
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return over
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(base[key], value) if key in base else value
    return out


def select(tree: Any, loc: Loc) -> Any:
    """The value at `loc`, or ABSENT."""
    node = tree
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            return ABSENT
    return node


def update(tree: dict[str, Any], loc: Loc, value: Any) -> None:
    """Set `loc` to `value`, adding missing sections on the way; a mapping merges into the mapping
    already there. Raises KeyError / IndexError / TypeError where the path cannot be followed."""
    node: Any = tree
    for part in loc[:-1]:
        if isinstance(node, list):
            node = node[_index(part, len(node))]
        elif isinstance(node, dict):
            node = node.setdefault(part, {})
        else:
            raise TypeError(f"cannot set `{'.'.join(map(str, loc))}`: `{part}` is under a value, not a section")
    last = loc[-1]
    if isinstance(node, list):
        i = _index(last, len(node))
        node[i] = merge(node[i], value)
    elif isinstance(node, dict):
        node[last] = merge(node[last], value) if last in node else value
    else:
        raise TypeError(f"`{'.'.join(map(str, loc[:-1]))}` is not a section")


def _index(part: Any, length: int) -> int:
    if not isinstance(part, int):
        raise KeyError(f"a list is indexed by a number, not '{part}'")
    if not 0 <= part < length:
        raise IndexError(f"index {part} is out of range (the list has {length} items)")
    return part


def _never(node: Any) -> bool:
    return False


def flatten(data: Any, prefix: str = "", leaf: Callable[[Any], bool] = _never) -> dict[str, Any]:
    """The one dotted-key flattener: {"a": {"b": 1}, "l": [{"x": 2}]} -> {"a.b": 1, "l[0].x": 2}.

    Mappings and lists of mappings are walked; anything else is a value: scalars, lists of scalars, an
    empty mapping or list, and a node `leaf` accepts (a caller's own unit, e.g. a PATH field's identity).
    An empty mapping at the top (no `prefix`: e.g. a run without recipe.yaml) has no keys."""
    if isinstance(data, dict) and not data and not prefix:
        return {}
    if isinstance(data, dict) and data and not leaf(data):
        items = [(f"{prefix}.{k}" if prefix else str(k), v) for k, v in data.items()]
    elif isinstance(data, list) and data and all(isinstance(v, dict) for v in data) and not leaf(data):
        items = [(f"{prefix}[{i}]", v) for i, v in enumerate(data)]
    else:
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in items:
        out.update(flatten(value, key, leaf))
    return out
