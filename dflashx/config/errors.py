"""Recipe errors that point at the file, the YAML line and the dotted key, with a fix.

Composed data keeps no line numbers, so `SourceMap` records where every key was written: it walks the
`yaml.compose` node tree of each file that contributed (base recipes first, then the recipe, the
hardware profile) and the command-line overrides, later sources replacing earlier ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from dflashx.config import suggest
from dflashx.config.fields import KEY_PROBLEM
from dflashx.config.schema import STAGE_ORDER, Recipe

Loc = tuple[str | int, ...]


def dotted(loc: Sequence[str | int]) -> str:
    """("dataset", "sources", 0, "path") -> "dataset.sources[0].path"."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@dataclass(frozen=True)
class Origin:
    """Where a value was written: a file and line, or a command-line override."""

    file: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        return ":".join(str(p) for p in (_display(self.file), self.line, self.column) if p is not None)


def _display(file: str) -> str:
    """A path relative to the working directory when it lies below it, else as it is."""
    try:
        return str(Path(file).relative_to(Path.cwd()))
    except ValueError:
        return file


@dataclass(frozen=True)
class RecipeProblem:
    """One thing wrong with a recipe (a `dflashx.config.problem.Problem`, code `recipe`), with where
    it was written and what was expected."""

    message: str
    origin: Origin | None = None
    key: str = ""
    expected: str | None = None
    fix: str = ""
    code: str = "recipe"

    def to_json(self) -> dict[str, Any]:
        """The problem as a plan finding (`code`, `severity`, `key`, `message`, `fix`) with its place."""
        return {
            "code": self.code, "severity": "error", "key": self.key, "message": self.message, "fix": self.fix,
            "expected": self.expected, "file": _display(self.origin.file) if self.origin else None,
            "line": self.origin.line if self.origin else None,
        }

    def format(self) -> str:
        head = ": ".join(p for p in (str(self.origin) if self.origin else None, self.key, self.message) if p)
        lines = [head]
        if self.expected:
            lines.append(f"    expected: {self.expected}")
        if self.fix:
            lines.append(f"    hint: {self.fix}")
        return "\n".join(lines)


class RecipeError(Exception):
    """A recipe that cannot be read or validated. The CLI prints it and exits with code 2."""

    exit_code = 2

    def __init__(self, problems: Sequence[RecipeProblem], recipe: Path | str | None = None):
        self.problems = list(problems)
        self.recipe = recipe
        super().__init__(self.format())

    def format(self) -> str:
        n = len(self.problems)
        title = f"recipe {_display(str(self.recipe))} is invalid" if self.recipe else "invalid recipe"
        body = "\n".join(p.format() for p in self.problems)
        return f"{title} ({n} problem{'s' if n != 1 else ''}):\n{body}"


def yaml_problem(exc: yaml.YAMLError, file: Path) -> RecipeProblem:
    """A YAML syntax error with its line and column (1-based)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    origin = Origin(str(file), mark.line + 1, mark.column + 1) if mark else Origin(str(file))
    what = " ".join(p for p in (getattr(exc, "context", None), getattr(exc, "problem", None)) if p)
    return RecipeProblem(
        f"YAML syntax error: {what or exc}",
        origin,
        fix="check the indentation, quoting and colons on that line and the one before it",
    )


class SourceMap:
    """Maps dotted keys (as tuples) to the place that wrote them."""

    def __init__(self) -> None:
        self._where: dict[Loc, Origin] = {}
        self._sections: dict[Loc, Origin] = {}  # a section whose keys one file writes (a hardware profile)
        self.files: list[Path] = []  # every file recorded, in the order it was merged

    def _drop_below(self, loc: Loc) -> None:
        for k in [k for k in self._where if len(k) > len(loc) and k[: len(loc)] == loc]:
            del self._where[k]

    def add_file(self, file: Path, node: yaml.Node, prefix: Loc = ()) -> None:
        """Record every key of a composed YAML document (keys already there are replaced)."""
        self.files.append(file)
        self._walk(str(file), node, prefix)

    def _walk(self, file: str, node: yaml.Node, loc: Loc) -> None:
        if loc and not isinstance(node, yaml.MappingNode):
            self._drop_below(loc)  # a scalar or a list replaces whatever the base had below it
        for key, key_node, value_node in _children(node):
            self._where[loc + (key,)] = Origin(file, key_node.start_mark.line + 1)
            self._walk(file, value_node, loc + (key,))

    def add_section(self, loc: Loc, where: Path | Origin) -> None:
        """The keys of section `loc` are written in `where` (`hardware: NAME`'s profile file, or `local`'s
        detection): a key missing there is located there, not at the line that named it."""
        self._sections[loc] = where if isinstance(where, Origin) else Origin(str(where))

    def add_override(self, loc: Loc, origin: Origin) -> None:
        self._drop_below(loc)
        for n in range(1, len(loc)):  # a new key's parents are new too when the override created them
            self._where.setdefault(loc[:n], origin)
        self._where[loc] = origin

    def locate(self, loc: Sequence[str | int]) -> Origin | None:
        """Where `loc` was written; failing that, the file that writes its section (`add_section`) or
        where its nearest written parent was written."""
        loc = tuple(loc)
        while loc:
            if loc in self._where:
                return self._where[loc]
            loc = loc[:-1]
            if loc in self._sections:
                return self._sections[loc]
        return None


def _children(node: yaml.Node) -> list[tuple[Any, yaml.Node, yaml.Node]]:
    """(key, node that marks its line, value node) for a mapping's items or a sequence's items."""
    if isinstance(node, yaml.MappingNode):
        return [(k.value, k, v) for k, v in node.value]
    if isinstance(node, yaml.SequenceNode):
        return [(i, item, item) for i, item in enumerate(node.value)]
    return []


def duplicate_keys(file: Path, node: yaml.Node, loc: Loc = ()) -> list[RecipeProblem]:
    """Keys written twice in one mapping (YAML would keep the last one silently)."""
    problems: list[RecipeProblem] = []
    seen: dict[Any, int] = {}
    for key, key_node, value_node in _children(node):
        line = key_node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode) and key in seen:
            problems.append(RecipeProblem(f"duplicate key (first written on line {seen[key]})", Origin(str(file), line),
                                          dotted(loc + (key,)), fix="keep one of the two"))
        seen[key] = line
        problems += duplicate_keys(file, value_node, loc + (key,))
    return problems


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def validation_problems(
    exc: ValidationError,
    sources: SourceMap,
    fallback: Origin,
    skip: Iterable[Loc] = (),
    root: type[BaseModel] = Recipe,
) -> list[RecipeProblem]:
    """Turn pydantic's errors into Problems with file/line, dotted key, expectation and hint."""
    skipped = {tuple(s) for s in skip}
    problems = []
    for err in exc.errors():
        loc: Loc = tuple(p for p in err["loc"] if isinstance(p, (str, int)))
        kind, ctx = err["type"], err.get("ctx") or {}
        if kind == KEY_PROBLEM:  # a section's check that blames one of its keys (`fields.key_problem`)
            loc += (ctx["key"],)
        if loc in skipped:
            continue
        origin = sources.locate(loc) or fallback
        value = err.get("input")
        secret = bool(loc) and suggest.looks_secret(str(loc[-1]), value)
        shown = not secret and kind not in ("missing", "extra_forbidden") and not isinstance(value, (dict, list))
        got = f" (got {_shown(value)})" if shown else ""
        expected: str | None = err["msg"].removeprefix("Value error, ")
        hint = None
        if kind == KEY_PROBLEM:
            message, expected, hint = err["msg"], None, ctx["fix"]
        elif kind == "extra_forbidden":
            message, expected, hint = "unknown key", None, suggest.unknown_key_hint(
                loc, root, STAGE_ORDER if root is Recipe else ())
        elif kind == "missing":
            message, expected = "required key is missing", None
            hint = f"add `{loc[-1]}:` under `{dotted(loc[:-1])}`" if len(loc) > 1 else f"add `{loc[-1]}:`"
        elif kind == "literal_error":
            message, hint = f"invalid value{got}", suggest.value_hint(loc, value, root)
        elif kind == "finite_number":
            message, hint = f"invalid value{got}", "write a finite number (YAML reads `.inf`, `1e309` as infinity)"
        else:
            message = f"invalid value{got}"
        problems.append(RecipeProblem(message, origin, dotted(loc), expected, hint or ""))
    return problems
