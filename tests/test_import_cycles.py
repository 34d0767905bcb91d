"""Arrows that show (issue 39): no import cycle among dflashx's modules, counting the imports made inside
functions, which run as surely as the others (only `if TYPE_CHECKING:` blocks are left out: they never run).

import-linter checks the config layer the same way (`acyclic_siblings` in pyproject.toml, run by
tests/test_layers.py); this test reads every module itself so the whole package is covered module by module.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "dflashx"

# Where a cycle is still allowed, each with its reason. Empty: every cycle found is a failure.
KNOWN_CYCLES: list[frozenset[str]] = []


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes inside `if TYPE_CHECKING:` blocks."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(inner) for inner in ast.walk(node))
    return skip


def _named_by(node: ast.AST, modules: dict[str, Path]) -> set[str]:
    """What one import statement names (`from pkg import mod` names the module when it is one)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        subs = (f"{node.module}.{alias.name}" for alias in node.names)
        return {sub if sub in modules else node.module for sub in subs}
    return set()


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The dflashx modules `path` imports, at module level or in a function (`from pkg import mod` counts
    the module)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) not in skip:
            found |= _named_by(node, modules)
    return {name for name in found if name in modules}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: imports_of(path, modules) - {name} for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_the_reader_sees_a_function_level_cycle(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]
    modules = {"dflashx.config.schema": PACKAGE / "config" / "schema.py"}
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from dflashx.config import schema\n")
    assert imports_of(probe, modules) == {"dflashx.config.schema"}
    probe.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dflashx.config import schema\n")
    assert imports_of(probe, modules) == set()


def test_no_import_cycle_in_the_package() -> None:
    found = set(cycles(import_graph()))
    assert found - set(KNOWN_CYCLES) == set(), "import cycles (function-level imports counted)"
    assert set(KNOWN_CYCLES) - found == set(), "a listed cycle is gone: take it off KNOWN_CYCLES"


# ------------------------------------------------------------------ what may be imported inside a function
# A dflashx module is imported inside a function only when it is heavy or optional: it imports (at module level,
# itself or through what it imports) one of these packages, or it is one of OPTIONAL_MODULES. The CLI is the
# exception: a command's module imports its work when it runs, so that `dflashx plan` pays at start-up for
# nothing it does not use (benchmarks/cli_latency.py).
HEAVY_PACKAGES = frozenset({
    "torch", "transformers", "deepspeed", "vllm", "sglang", "datasets", "tokenizers", "safetensors", "accelerate",
    "wandb", "matplotlib", "pandas", "pyarrow", "numpy", "boto3", "botocore", "huggingface_hub", "liger_kernel",
    "torchao", "pynvml", "psutil",
})
OPTIONAL_MODULES = frozenset({"dflashx.tiny"})  # the embedded default, built on first use (`targets.locate`)
LAZY_FROM = ("dflashx.cli",)
def _module_level(path: Path, modules: dict[str, Path]) -> set[str]:
    """What `path` imports when it is imported: statements outside functions (in `try`/`if`/class bodies too),
    dflashx modules by name and third-party packages by their top-level name."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    found: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or id(node) in skip:
                continue
            found.update(_named_by(node, modules))
            for block in ("body", "orelse", "handlers", "finalbody"):
                inner = getattr(node, block, None)
                if isinstance(inner, list):
                    visit([n for n in inner if isinstance(n, ast.stmt)] + [
                        s for h in inner if isinstance(h, ast.ExceptHandler) for s in h.body])

    visit(tree.body)
    return found


def heavy_modules(modules: dict[str, Path]) -> set[str]:
    """The dflashx modules whose import pulls in a heavy package (transitively, module level only)."""
    direct = {name: _module_level(path, modules) for name, path in modules.items()}
    heavy = {name for name, imported in direct.items() if {i.split(".")[0] for i in imported} & HEAVY_PACKAGES}
    grew = True
    while grew:
        more = {name for name, imported in direct.items() if name not in heavy and imported & heavy}
        heavy |= more
        grew = bool(more)
    return heavy


def lazy_imports_of_light_modules() -> set[tuple[str, str]]:
    modules = _modules()
    heavy = heavy_modules(modules)
    found = set()
    for name, path in modules.items():
        if name.startswith(LAZY_FROM):
            continue
        for imported in imports_of(path, modules) - _module_level(path, modules) - {name}:
            if imported not in heavy and not imported.startswith(tuple(OPTIONAL_MODULES)):
                found.add((name, imported))
    return found


def test_a_light_module_is_imported_at_module_level() -> None:
    found = lazy_imports_of_light_modules()
    assert sorted(found) == [], "import these at module level (or add a heavy package)"


def test_heavy_means_a_heavy_package_somewhere_below() -> None:
    heavy = heavy_modules(_modules())
    assert {"dflashx.dflash.model", "dflashx.dflash.trainer"} <= heavy
    assert not {"dflashx.plan.plan", "dflashx.config.schema", "dflashx.resolve.resolve"} & heavy
