"""Did-you-mean hints: close matches among the schema's keys, literal values and profile names; the one
did-you-mean helper (`did_you_mean`) of every "unknown name" message.

It imports no dflashx module: the schema's sections use it for their own did-you-mean, so the caller hands in
the model a hint is about (`root`; config.errors passes the recipe or the hardware profile)."""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

Loc = tuple[str | int, ...]


def close_matches(word: str, choices: Iterable[str]) -> list[str]:
    """Up to three choices close to `word`, best first."""
    return difflib.get_close_matches(word, sorted(set(choices)), n=3, cutoff=0.6)


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """`"did you mean 'lr'?"` for the closest choices to `word`, or None when nothing is close."""
    return _phrase(close_matches(word, choices))


def _phrase(matches: Sequence[str]) -> str | None:
    if not matches:
        return None
    return "did you mean " + " or ".join(repr(m) for m in matches) + "?"


def _unwrap(tp: Any) -> Any:
    """Strip Annotated[...] and Optional[...] down to the type that holds the value."""
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def type_at(loc: Sequence[str | int], root: type[BaseModel]) -> Any:
    """The schema type of the value at `loc` (e.g. ("stages", "train")) in `root`, or None if unknown."""
    tp: Any = root
    for part in loc:
        tp = _unwrap(tp)
        origin = get_origin(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(part, str):
            field = tp.model_fields.get(part)
            if field is None:
                return None
            tp = field.annotation
        elif origin is list and isinstance(part, int):
            tp = get_args(tp)[0]
        elif origin is dict:
            tp = get_args(tp)[1]
        else:
            return None
    return _unwrap(tp)


def keys_at(loc: Sequence[str | int], root: type[BaseModel]) -> list[str] | None:
    """The keys the schema allows in the mapping at `loc`; None when that mapping is free-form."""
    tp = type_at(loc, root)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return list(tp.model_fields)
    return None


def literal_values(loc: Sequence[str | int], root: type[BaseModel]) -> list[str]:
    """The allowed values of a Literal field at `loc` (as strings), else []."""
    tp = type_at(loc, root)
    if get_origin(tp) is Literal:
        return [str(v) for v in get_args(tp)]
    return []


def unknown_key_hint(loc: Loc, root: type[BaseModel], stages: Sequence[str] = ()) -> str | None:
    """Hint for an unknown key at `loc`: a close match at its level, else the keys allowed there. `stages`:
    the stage names a top-level key may have meant (`trian:` most likely meant stages.train)."""
    key = str(loc[-1])
    allowed = keys_at(loc[:-1], root) or []
    matches = close_matches(key, allowed)
    if len(loc) == 1:
        matches += [f"stages.{m}" for m in close_matches(key, stages)]
    hint = _phrase(matches)
    if hint:
        return hint
    return "allowed keys here: " + ", ".join(allowed) if allowed else None


def value_hint(loc: Loc, value: Any, root: type[BaseModel]) -> str | None:
    """Hint for a value not among a Literal field's choices."""
    if not isinstance(value, str):
        return None
    return did_you_mean(value, literal_values(loc, root))


SECRET_KEY = re.compile(
    r"(secret|password|passwd|api_?key|credential|private_key|access_key|(^|_)token$)", re.I
)
AWS_KEY_ID = re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b")


def looks_secret(key: str, value: Any) -> bool:
    """True for keys such as `aws_secret_access_key` or values shaped like an AWS access key id."""
    return bool(SECRET_KEY.search(key)) or (isinstance(value, str) and bool(AWS_KEY_ID.search(value)))
