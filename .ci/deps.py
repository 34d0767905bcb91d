"""dflashx's dependencies as pyproject.toml states them (the package's and the `dev` extra's), for .ci/run.

    python .ci/deps.py lowest   # `name==lower-bound` per line: a pip constraints file (the lowest releases)
    python .ci/deps.py names    # the names, one per line: what `pip install --upgrade` lifts to the newest
    python .ci/deps.py versions # the release of each one installed here (and of torch, pip, setuptools)

torch is left out of both: README installs it pinned (the CPU wheel), and so does every CI run.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^]]*\])?\s*(.*)$")


def requirements() -> list[tuple[str, str]]:
    """(name, version specifiers) of every requirement of the package and of its `dev` extra."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    out = []
    for text in [*project["dependencies"], *project["optional-dependencies"]["dev"]]:
        match = REQUIREMENT.match(text.split(";")[0])
        if not match:
            sys.exit(f"{PYPROJECT}: cannot read the requirement {text!r}: write it as `name>=X,<Y`")
        name, _, spec = match.groups()
        if name.lower() != "torch":
            out.append((name, spec.replace(" ", "")))
    return out


def lowest() -> list[str]:
    """`name==X` for every requirement whose lower bound is `>=X`; a requirement without one is an error."""
    lines = []
    for name, spec in requirements():
        bound = re.search(r"(?:^|,)>=([^,]+)", spec)
        if not bound:
            sys.exit(f"{PYPROJECT}: `{name}{spec}` has no lower bound `>=X`: add the oldest release that was tested")
        lines.append(f"{name}=={bound.group(1)}")
    return lines


def names() -> list[str]:
    return list(dict.fromkeys(name for name, _ in requirements()))


def versions() -> list[str]:
    """`name  release  (bounds)` for torch, every requirement, pip and setuptools, as installed here."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    bounds = dict(requirements())
    lines = [f"{'python':<16} {platform.python_version():<14} ({sys.executable})"]
    for name in ["torch", *names(), "pip", "setuptools"]:
        try:
            found = version(name)
        except PackageNotFoundError:
            found = "not installed"
        lines.append(f"{name:<16} {found:<14} {bounds.get(name, '')}".rstrip())
    return lines


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) == 2 else ""
    commands = {"lowest": lowest, "names": names, "versions": versions}
    if what not in commands:
        sys.exit(f"usage: python .ci/deps.py {'|'.join(commands)}")
    print("\n".join(commands[what]()))
