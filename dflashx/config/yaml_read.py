"""Read one YAML mapping file (a recipe, a base recipe, a profile) safely.

The file is read as bytes (at most `MAX_BYTES`), decoded as UTF-8, scanned for nesting deeper than
`MAX_DEPTH` before any parser builds a tree (so the refusal reads the same whatever the installed
PyYAML's own limits), composed into a node tree (kept for line numbers), bounded — the tree an alias `*name` expands to
must stay small, shallow and
acyclic, so an alias bomb ("billion laughs") is refused before it is copied out — checked for
duplicate keys and only then constructed into plain dicts and lists. Scalars read as recipes always
read them: `1e-4` is a float (YAML 1.2, as in OmegaConf), a date stays a string. Every failure is a
`RecipeError` naming the file, and the line where one is known.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from dflashx.config import suggest
from dflashx.config.errors import Origin, RecipeProblem, RecipeError, duplicate_keys, yaml_problem

MAX_BYTES = 4 * 2**20  # a recipe is a few KiB
MAX_NODES = 100_000  # YAML nodes once every alias is expanded; a recipe has a few hundred
MAX_DEPTH = 64  # nesting levels; a recipe has fewer than ten
_TIMESTAMP = "tag:yaml.org,2002:timestamp"


class RecipeLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """Safe YAML (the C parser where built: it keeps line marks too) with floats also written
    without a dot (`1e-4`) and dates kept as strings."""


RecipeLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _TIMESTAMP]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"), list("-+0123456789"))
_ALIAS_HINT = "write the values out, or use fewer (and less nested) anchors `&name` and aliases `*name`"
_OPENS = (yaml.BlockMappingStartToken, yaml.BlockSequenceStartToken, yaml.FlowMappingStartToken,
          yaml.FlowSequenceStartToken)
_CLOSES = (yaml.BlockEndToken, yaml.FlowMappingEndToken, yaml.FlowSequenceEndToken)


def read_mapping(file: Path) -> tuple[dict[str, Any], yaml.MappingNode]:
    """One YAML mapping file as plain data and its node tree; raises RecipeError."""
    text = _read_text(file)
    too_deep = _too_deep_line(text)
    if too_deep is not None:
        raise RecipeError([_depth_problem(Origin(str(file), too_deep))], file)
    loader = RecipeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _fail(_bounds_problems(node, file) or duplicate_keys(file, node), file)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        raise RecipeError([yaml_problem(exc, file)], file) from None
    except TypeError as exc:  # e.g. a list or a mapping used as a key
        raise RecipeError([RecipeProblem(f"cannot read the YAML: {exc}", Origin(str(file)),
                                         fix="keys must be plain names and values plain YAML")], file) from None
    finally:
        loader.dispose()
    if not isinstance(node, yaml.MappingNode) or not isinstance(data, dict):
        raise RecipeError([RecipeProblem(
            "the file must hold a YAML mapping of keys" + (" (it is empty)" if node is None else ""),
            Origin(str(file), 1), fix="start with e.g. `name: my-run`",
        )], file)
    return data, node


def load_value(text: str) -> Any:
    """One YAML value as a recipe reads it (a command-line override's `VALUE`); raises yaml.YAMLError."""
    if _too_deep_line(text) is not None:
        raise yaml.YAMLError(f"the value is nested more than {MAX_DEPTH} levels deep")
    return yaml.load(text, Loader=RecipeLoader)


def _too_deep_line(text: str) -> int | None:
    """The line (1-based) where the text's lists and mappings first nest more than `MAX_DEPTH` deep.

    Read from the scanner's tokens, before a parser composes anything: the parsers' own limits depend
    on the PyYAML release (6.0.4's libyaml stops at 1,000 levels with its own error, 6.0.3's does not,
    the pure-Python composer overflows Python's recursion limit near 1,000). The scanner reads up to
    1,024 characters ahead, so on one long line of `[` a scanner's own nesting limit can come first:
    that error is the same refusal. Any other syntax error is left for the parser to report.
    """
    scanner = RecipeLoader(text)
    depth = 0
    try:
        while scanner.check_token():
            token = scanner.get_token()
            if isinstance(token, _CLOSES):
                depth -= 1
            elif isinstance(token, _OPENS):
                depth += 1
                if depth > MAX_DEPTH:
                    return int(token.start_mark.line) + 1
    except yaml.MarkedYAMLError as exc:
        if "nesting depth" in (exc.problem or "") and exc.problem_mark is not None:
            return int(exc.problem_mark.line) + 1
    finally:
        scanner.dispose()
    return None


def _depth_problem(where: Origin) -> RecipeProblem:
    return RecipeProblem(f"the YAML is nested more than {MAX_DEPTH} levels deep", where,
                         fix="a recipe is a few levels of sections: write this value with fewer nested lists "
                        "`[...]` and mappings `{...}` (or indented levels)")


def _fail(problems: list[RecipeProblem], file: Path) -> None:
    if problems:
        raise RecipeError(problems, file)


def _read_text(file: Path) -> str:
    """The file's text: unreadable, oversized and non-UTF-8 files are problems with a place."""
    try:
        with file.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        siblings = (f.name for f in file.parent.glob("*.yaml")) if file.parent.is_dir() else ()
        hint = suggest.did_you_mean(file.name, siblings)
        problem = RecipeProblem(f"cannot read file: {exc.strerror}", Origin(str(file)), fix=hint or "")
        raise RecipeError([problem], file) from None
    if len(data) > MAX_BYTES:
        raise RecipeError([RecipeProblem(f"file is larger than {MAX_BYTES // 2**20} MiB: not a recipe",
                                         Origin(str(file)))], file)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise RecipeError([RecipeProblem(
            f"not UTF-8 text: byte 0x{data[exc.start]:02x} at byte offset {exc.start} ({exc.reason})",
            Origin(str(file), line, column), fix="save the file as UTF-8",
        )], file) from None


def _node_children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _bounds_problems(root: yaml.Node, file: Path) -> list[RecipeProblem]:
    """The expanded tree's size and depth, and recursive aliases, without expanding it.

    Aliases make the composed tree a graph whose nodes are shared; one pass over the distinct
    nodes (an explicit stack, so deep nesting cannot overflow Python's) counts what each expands to.
    """
    size: dict[int, int] = {}
    height: dict[int, int] = {}
    on_path: set[int] = set()  # nodes whose subtree is being counted: their ancestors-to-be
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            kids = _node_children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            height[key] = 1 + max((height[id(k)] for k in kids), default=0)
            on_path.discard(key)
            where = Origin(str(file), node.start_mark.line + 1)
            if size[key] > MAX_NODES:
                return [RecipeProblem(f"the YAML expands to more than {MAX_NODES:,} values (aliases copy what "
                                      "their anchor holds): refused as an alias bomb", where, fix=_ALIAS_HINT)]
            if height[key] > MAX_DEPTH:
                return [_depth_problem(where)]
            continue
        if key in size:
            continue  # an alias of a node already counted
        if key in on_path:
            return [RecipeProblem("recursive alias: an anchor is used inside itself",
                                  Origin(str(file), node.start_mark.line + 1), fix=_ALIAS_HINT)]
        on_path.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _node_children(node))
    return []
