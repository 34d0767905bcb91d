""".ci/deps.py reads pyproject.toml for .ci/run: the lowest releases it allows (a pip constraints file
for `DFLASHX_CI_DEPS=lowest`), the names to upgrade (`newest`), and a requirement without a lower bound
is an error naming the file and the fix; .ci/run refuses a mode it does not know before installing."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEPS = REPO / ".ci" / "deps.py"


def _deps(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DEPS), *args], capture_output=True, text=True, timeout=60, check=False)


def test_lowest_pins_every_requirement_but_torch_to_its_lower_bound() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {re.match(r"[\w.-]+", t).group(0): t for t in [*project["dependencies"],
                                                           *project["optional-dependencies"]["dev"]]}
    lowest = _deps("lowest").stdout.split()
    names = _deps("names").stdout.split()
    assert names == [n for n in wanted if n != "torch"]  # README pins torch itself
    assert [line.split("==")[0] for line in lowest] == names
    for line in lowest:
        name, release = line.split("==")
        assert re.search(rf"(^|,)>={re.escape(release)}(,|$)", wanted[name][len(name):]), (line, wanted[name])


def test_a_requirement_without_a_lower_bound_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\ndependencies = ["torch==2.13.0", "pyyaml>=6.0.1", "rich<15"]\n'
                         '[project.optional-dependencies]\ndev = ["pytest>=8"]\n')
    module = runpy.run_path(str(DEPS))
    monkeypatch.setitem(module["lowest"].__globals__, "PYPROJECT", pyproject)
    assert module["names"]() == ["pyyaml", "rich", "pytest"]
    with pytest.raises(SystemExit) as exited:
        module["lowest"]()
    assert str(pyproject) in str(exited.value) and "`rich<15` has no lower bound" in str(exited.value)
    assert "add the oldest release that was tested" in str(exited.value)


def test_versions_lists_the_key_packages_as_installed() -> None:
    listed = {line.split()[0]: line.split()[1] for line in _deps("versions").stdout.splitlines()}
    from importlib.metadata import version
    for name in ("torch", "transformers", "deepspeed", "pydantic", "pyyaml", "datasets", "typer", "pip"):
        assert listed[name] == version(name), name


def test_ci_run_refuses_an_unknown_mode_before_installing(tmp_path: Path) -> None:
    env = {**os.environ, "DFLASHX_CI_DEPS": "oldest"}
    done = subprocess.run(["bash", str(REPO / ".ci" / "run")], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2 and "DFLASHX_CI_DEPS=oldest: use default, newest or lowest" in done.stderr
