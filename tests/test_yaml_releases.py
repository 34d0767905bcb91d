"""Deep nesting is refused with dflashx's own message under each PyYAML release we meet, with its C
parser and with the pure-Python one.

PyYAML 6.0.4's libyaml stops at 1,000 nesting levels with its own "exceeded maximum nesting depth",
6.0.3's composes them, and the pure-Python composer overflows Python's recursion limit: the refusal
must not depend on which one is installed. Each release is really installed (`pip install --target`
into a throwaway folder, from pip's cache or index) and the loader runs in a subprocess with that
folder first on sys.path; nothing about PyYAML is imitated. When a release cannot be installed
(offline, no index), its cases are skipped and say so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # pip installs each release

RELEASES = ("6.0.3", "6.0.4")  # 6.0.4: the first whose libyaml has a nesting limit of its own

# name -> (recipe text, line of the refusal). The tiny recipe's keys stay valid around the deep value.
CASES = {
    "flow lists, one line": ("name: x\nz: " + "[" * 5000 + "]" * 5000 + "\n", 2),
    "flow mappings": ("name: x\nz: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n", 2),
    "indented mappings": ("name: x\n" + "".join("  " * i + "a:\n" for i in range(1200)) + "  " * 1200 + "b: 1\n",
                          2 + 64),
    "70 levels (under every parser's limit)": ("name: x\nz: " + "[" * 70 + "]" * 70 + "\n", 2),
}

PROBE = r"""
import json, sys
import yaml
if sys.argv[2] == "python":
    del yaml.CSafeLoader  # as where PyYAML was built without libyaml
from pathlib import Path
from dflashx.config import yaml_read
from dflashx.config.errors import RecipeError
from dflashx.config.load import parse_overrides
out = {"version": yaml.__version__, "yaml": yaml.__file__, "loader": yaml_read.RecipeLoader.__mro__[1].__name__,
       "files": {}}
for name, file in json.loads(sys.argv[1]).items():
    try:
        yaml_read.read_mapping(Path(file))
        out["files"][name] = None
    except RecipeError as exc:
        [p] = exc.problems
        out["files"][name] = {"message": p.message, "file": p.origin.file, "line": p.origin.line, "hint": p.fix}
_, problems = parse_overrides(["z=" + "[" * 5000 + "]" * 5000])
out["override"] = [p.message for p in problems]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | str]:
    """release -> a folder holding only that PyYAML (a binary wheel: its libyaml built in), or why not."""
    folders: dict[str, Path | str] = {}
    for release in RELEASES:
        target = tmp_path_factory.mktemp(f"pyyaml-{release}")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--only-binary=:all:",
             "--disable-pip-version-check", "--no-input", "--target", str(target), f"pyyaml=={release}"],
            capture_output=True, text=True, timeout=300, check=False)
        folders[release] = target if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]
    return folders


@pytest.mark.parametrize("parser", ["C", "python"])
@pytest.mark.parametrize("release", RELEASES)
def test_deep_nesting_gives_dflashx_own_message(release: str, parser: str, releases: dict[str, Path | str],
                                                 tmp_path: Path) -> None:
    target = releases[release]
    if not isinstance(target, Path):
        pytest.skip(f"PyYAML {release} cannot be installed here (offline, or no index has it): `pip install "
                    f"--target DIR pyyaml=={release}` said: {target}")
    files = {}
    for i, (name, (text, _)) in enumerate(CASES.items()):
        files[name] = str(tmp_path / f"deep{i}.yaml")
        Path(files[name]).write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONSTARTUP")}
    env["PYTHONPATH"] = os.pathsep.join([str(target), str(REPO)])  # this release first, then this checkout
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(files), parser], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout)

    assert seen["version"] == release and Path(seen["yaml"]).is_relative_to(target), seen
    if parser == "C":
        assert seen["loader"] == "CSafeLoader", "the wheel's libyaml is not in use"
    else:
        assert seen["loader"] == "SafeLoader"
    for name, (_, line) in CASES.items():
        problem = seen["files"][name]
        assert problem is not None, f"{name}: loaded"
        assert problem["message"] == "the YAML is nested more than 64 levels deep", (name, problem)
        assert (problem["file"], problem["line"]) == (files[name], line), (name, problem)
        assert "fewer nested lists" in problem["hint"], (name, problem)
    assert seen["override"] == ["cannot parse the value: the value is nested more than 64 levels deep"]
