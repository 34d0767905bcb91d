"""No architecture question outside the drafter-architecture registry and its entries (issue 39): everything else
asks `dflashx.config.architectures`, never which architecture a drafter is. Found in the code's AST:
- a comparison with an architecture's name (`==`, `!=`, `in`), or a lookup keyed by one (`X["dflash2"]`, a dict
  display keyed by names);
- an `is None` / `is not None` test of an architecture's module (`candidate_selector`, the convolutions), under
  any alias (a name assigned from one);
- an `isinstance` check of an architecture's class (one defined in an entry's torch half);
- a proxy-field test: an architecture's key (`selector_rank` ...) or figure used as a truth value or compared."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import tarfile
import io
from pathlib import Path

import pytest

from dflashx.config import architectures

PACKAGE = Path(__file__).resolve().parents[1] / "dflashx"
MODULES = ("candidate_selector", "attention_conv", "mlp_conv")  # the architectures' module attributes


def _entry_files() -> set[str]:
    """The registry and its entries: every module a spec names, and the registry package (relative to dflashx/)."""
    out = {str(p.relative_to(PACKAGE)) for p in (PACKAGE / "config" / "architectures").glob("*.py")}
    for spec in architectures.REGISTRY.values():
        for path in (spec.torch, spec.export):
            out.add(path.removeprefix("dflashx.").replace(".", "/") + ".py")
    return out


def _classes() -> set[str]:
    """The classes the entries' torch halves define (an architecture's modules)."""
    out: set[str] = set()
    for spec in architectures.REGISTRY.values():
        module = importlib.import_module(spec.torch)
        out |= {name for name, obj in vars(module).items()
                if inspect.isclass(obj) and obj.__module__ == module.__name__}
    return out


def _proxies() -> set[str]:
    """Every architecture's keys, and the names of its figures beyond the common ones."""
    common = set(architectures.spec.ModuleFigures.__dataclass_fields__)
    out = set(architectures.key_fields())
    for spec in architectures.REGISTRY.values():
        shapes = architectures.spec.Shapes(2, 64, 128)
        figures = spec.module_figures(shapes, spec.keys())
        out |= set(type(figures).__dataclass_fields__) - common
    return out


def _mentions(node: ast.AST, names: set[str]) -> bool:
    return any((isinstance(n, ast.Attribute) and n.attr in names) or (isinstance(n, ast.Name) and n.id in names)
               for n in ast.walk(node))


def _aliases(tree: ast.AST, names: set[str]) -> set[str]:
    """Names bound (anywhere in the module) to an expression that reads one of `names` as an attribute."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(n, ast.Attribute) and n.attr in names
                                                for n in ast.walk(node.value)):
            for target in node.targets:
                out |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return out


def _tests(tree: ast.AST) -> list[ast.expr]:
    """Every expression used as a truth value (conditions, boolean operands, `not`)."""
    out: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp, ast.While, ast.Assert)):
            out.append(node.test)
        elif isinstance(node, ast.comprehension):
            out += node.ifs
        elif isinstance(node, ast.BoolOp):
            out += node.values
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            out.append(node.operand)
    return out


def _tables(tree: ast.AST, names: set[str]) -> set[str]:
    """Names bound to a dict display keyed by architecture names (a name-keyed table)."""
    return {t.id for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
            and isinstance(node.value, ast.Dict)
            and any(isinstance(k, ast.Constant) and k.value in names for k in node.value.keys)
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}


def questions(source: str, where: str, names: set[str], classes: set[str], proxies: set[str],
              tables: frozenset[str] = frozenset()) -> list[str]:
    tree = ast.parse(source)
    found: list[str] = []
    modules = set(MODULES) | _aliases(tree, set(MODULES))
    proxy_names = proxies | _aliases(tree, proxies)

    def named(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(named(e) for e in node.elts)

    for node in ast.walk(tree):
        at = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(named(s) for s in sides):
                found.append(f"{at} compares with an architecture name")
            if any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops) and any(
                    _mentions(s, modules) for s in sides):
                found.append(f"{at} tests an architecture's module against None")
            if any(_mentions(s, proxy_names) for s in sides):
                found.append(f"{at} compares an architecture's key or figure")
        elif isinstance(node, ast.Subscript) and (named(node.slice) or _mentions(node.value, set(tables))):
            found.append(f"{at} looks up by an architecture name")
        elif isinstance(node, ast.Dict) and any(k is not None and named(k) for k in node.keys):
            found.append(f"{at} keys a table by architecture names")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
              and len(node.args) == 2 and _mentions(node.args[1], classes)):
            found.append(f"{at} checks an architecture's class")
    for test in _tests(tree):
        if _mentions(test, proxy_names) and not isinstance(test, ast.Compare):
            found.append(f"{where}:{test.lineno} tests an architecture's key or figure for truth")
    return sorted(set(found))


def scan(root: Path) -> list[str]:
    names, classes, proxies, skip = set(architectures.names()), _classes(), _proxies(), _entry_files()
    sources = {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*.py"))}
    tables = frozenset(t for text in sources.values() for t in _tables(ast.parse(text), names))
    out: list[str] = []
    for where, text in sources.items():
        if where not in skip:
            out += questions(text, where, names, classes, proxies, tables)
    return out


def test_no_architecture_question_outside_the_registry() -> None:
    assert scan(PACKAGE) == []


@pytest.mark.parametrize(("source", "count"), [
    ('if d.architecture == "dflash2": pass', 1),
    ('x = HF["dflash2"]', 1),
    ("x = HF[d.architecture]", 1),
    ('T = {"dflash": 1, "dflash2": 2}', 1),
    ("s = m.candidate_selector\nif s is None: pass", 1),
    ("if isinstance(m, PathSelector): pass", 1),
    ("y = 1 if dims.selector_rank else 0", 1),
    ("k = d.conv_kernel_size\nif k: pass", 1),
    ('spec = architecture(d.architecture)\nif spec.causal_sliding: pass', 0),
])
def test_each_kind_of_question_is_found(source: str, count: int) -> None:
    assert len(questions(source, "m.py", {"dflash", "dflash2"}, {"PathSelector"},
                         {"selector_rank", "conv_kernel_size"}, frozenset({"HF"}))) == count


def test_the_code_before_the_registry_asked_in_many_places(tmp_path: Path) -> None:
    """The check finds today's kinds of questions in main before issue 39 (f5ac536's successor 5272ed8)."""
    try:
        blob = subprocess.run(["git", "-C", str(PACKAGE.parent), "archive", "5272ed8", "dflashx"],
                              capture_output=True, check=True).stdout
    except (subprocess.CalledProcessError, FileNotFoundError):
        pytest.skip("no git history here")
    with tarfile.open(fileobj=io.BytesIO(blob)) as archive:
        archive.extractall(tmp_path, filter="data")
    found = scan(tmp_path / "dflashx")
    kinds = {line.split(" ", 1)[1] for line in found}
    assert len(found) > 20 and {"compares with an architecture name", "tests an architecture's module against None",
                                "looks up by an architecture name"} <= kinds
