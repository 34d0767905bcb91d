"""`${...}` in recipe values, interpolated after composition and overrides (docs/recipes.md).

Two forms, written as in OmegaConf (whose syntax recipes have always used):
  `${key.path}`              another key's value (`${dataset.sources.0.name}` or `[0]` for list items);
                             a value that is only `${...}` takes the referenced value with its type,
                             one with text around it becomes a string
  `${oc.env:NAME}`           an environment variable (a string); `${oc.env:NAME,default}` falls back
                             to `default` (quotes are stripped, `null` is None)
`???` marks a value that must be set (by an override, for instance); `\\${` is a literal `${`.
Anything else inside `${...}` is an error that says which forms exist.
"""

from __future__ import annotations

import os
import re
from typing import Any

MISSING = "???"
_ENV = "oc.env"
_PATH_PART = re.compile(r"[^.\[\]]+|\[\d+\]")


class InterpolationError(ValueError):
    """A `${...}` that cannot be interpolated; `env` when an environment variable is missing."""

    def __init__(self, message: str, env: bool = False) -> None:
        super().__init__(message)
        self.env = env


class MissingValue(InterpolationError):
    """A `???` left unset."""


def needs_interpolation(value: Any) -> bool:
    return isinstance(value, str) and ("${" in value or value == MISSING)


class Interpolator:
    """Resolves values against one composed tree (plain dicts and lists)."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self._stack: list[str] = []

    def value(self, value: Any) -> Any:
        """`value` with every `${...}` inside it (and inside its children) interpolated."""
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if not isinstance(value, str):
            return value
        if value == MISSING:
            raise MissingValue("value is required (`???`)")
        if "${" not in value:
            return value
        pieces = _split(value)
        if len(pieces) == 1 and isinstance(pieces[0], _Expr):
            return self._expr(pieces[0].body)
        return "".join(p if isinstance(p, str) else _text(self._expr(p.body)) for p in pieces)

    def _expr(self, body: str) -> Any:
        body = body.strip()
        head, colon, args = body.partition(":")
        if colon:
            if head.strip() != _ENV:
                raise InterpolationError(f"unsupported resolver '{head.strip()}' in ${{{body}}}: recipes support "
                                         "${key.path} and ${oc.env:NAME,default}")
            name, comma, default = args.partition(",")
            name = name.strip()
            if name in os.environ:
                return os.environ[name]
            if not comma:
                raise InterpolationError(f"Environment variable '{name}' not found", env=True)
            default = _unquote(default.strip())
            return None if default == "null" else self.value(default)
        return self._key(body)

    def _key(self, path: str) -> Any:
        if path in self._stack:
            raise InterpolationError("interpolation cycle: " + " -> ".join([*self._stack, path]))
        node: Any = self.root
        for part in _PATH_PART.findall(path):
            key: Any = int(part.strip("[]")) if part.startswith("[") or part.isdigit() else part
            if isinstance(node, dict) and key in node:
                node = node[key]
            elif isinstance(node, list) and isinstance(key, int) and key < len(node):
                node = node[key]
            else:
                raise InterpolationError(f"key '{path}' not found (in ${{{path}}})")
        self._stack.append(path)
        try:
            return self.value(node)
        finally:
            self._stack.pop()


class _Expr:
    __slots__ = ("body",)

    def __init__(self, body: str) -> None:
        self.body = body


def _split(text: str) -> list[str | _Expr]:
    """Literal text and `${...}` expressions (nested braces matched), `\\${` kept literal."""
    out: list[str | _Expr] = []
    literal, i = [], 0
    while i < len(text):
        if text.startswith("\\${", i):
            literal.append("${")
            i += 3
        elif text.startswith("${", i):
            depth, j = 1, i + 2
            while j < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
            if depth:
                raise InterpolationError(f"unclosed ${{ in {text!r}")
            if literal:
                out.append("".join(literal))
                literal = []
            out.append(_Expr(text[i + 2:j - 1]))
            i = j
        else:
            literal.append(text[i])
            i += 1
    if literal:
        out.append("".join(literal))
    return out


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _text(value: Any) -> str:
    return "null" if value is None else str(value)
