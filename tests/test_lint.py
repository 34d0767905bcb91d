"""The linter and the type checker, as .ci/run runs them, so README's one test command checks them too:
`ruff check dflashx tests benchmarks` and `mypy` (pyproject.toml's [tool.ruff] and [tool.mypy]: the whole
package)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_run_fakes import REPO


def _run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    # the interpreter's own ruff and mypy (the dev extra): a virtual environment need not be activated
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_ruff_passes_on_the_package_tests_and_benchmarks():
    proc = _run("ruff", "check", "dflashx", "tests", "benchmarks")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_mypy_passes_on_the_whole_package():
    proc = _run("mypy")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    package = list((REPO / "dflashx").rglob("*.py"))
    assert f"no issues found in {len(package)} source files" in proc.stdout  # `files` covers all of dflashx


def test_the_configured_rules_catch_what_the_noqa_comments_stand_for(tmp_path: Path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\ndef f(x):\n    try:\n        return x()\n    except Exception:\n"
                   "        return None\n\n\ny = '" + "a" * 130 + "'\n")
    proc = _run("ruff", "check", "--no-cache", "--config", str(REPO / "pyproject.toml"), "--output-format", "concise",
                str(bad))
    assert proc.returncode == 1
    found = {line.split(": ")[1].split()[0] for line in proc.stdout.splitlines() if line.startswith(str(bad))}
    assert found == {"F401", "BLE001", "E501"}, proc.stdout
