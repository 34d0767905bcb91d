"""A composed recipe as plain dicts and lists: merge two files, read and write one dotted key."""

from __future__ import annotations

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
