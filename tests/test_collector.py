"""The collector's settings per kind of `dflashx` process (`dflashx.track.collector`), each in a real child process:
a command that may import torch (and a launched training rank) collects its young generation every
YOUNG_THRESHOLD allocations, the older generations as CPython sets them; a pure command runs without the
collector; a plain Python process keeps CPython's defaults."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dflashx.track.collector import YOUNG_THRESHOLD

REPO = Path(__file__).resolve().parents[1]
REPORT = "import gc, json; print(json.dumps([gc.isenabled(), gc.get_threshold()]))"


def _collector(prelude: str) -> tuple[bool, list[int]]:
    code = f"{prelude}\n{REPORT}"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    enabled, threshold = json.loads(out.strip().splitlines()[-1])
    return enabled, threshold


def test_a_command_that_may_import_torch_collects_young_objects_less_often():
    default = _collector("")[1]
    enabled, threshold = _collector("import sys; sys.argv = ['dflashx', 'run', 'recipes/tiny.yaml']\n"
                                    "import dflashx.cli.main")
    assert enabled and threshold == [YOUNG_THRESHOLD, *default[1:]]
    assert default[0] < YOUNG_THRESHOLD


def test_a_pure_command_runs_without_the_collector():
    enabled, _ = _collector("import sys; sys.argv = ['dflashx', 'plan', 'recipes/tiny.yaml']\nimport dflashx.cli.main")
    assert not enabled


def test_a_launched_training_rank_collects_as_a_run_does():
    default = _collector("")[1]
    enabled, threshold = _collector(
        "import runpy, sys\nsys.argv = ['train', '--help']\n"
        "try:\n    runpy.run_module('dflashx.stages.train', run_name='__main__')\nexcept SystemExit:\n    pass")
    assert enabled and threshold == [YOUNG_THRESHOLD, *default[1:]]
    assert _collector("import dflashx.stages.train") == (True, default)  # imported, not run: as Python sets it
