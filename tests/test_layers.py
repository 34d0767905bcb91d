"""The architecture as the docs draw it, checked: import-linter's contracts (pyproject.toml) and
the stage table of docs/design.md against the one stage-graph declaration."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from dflashx.stages.graph import GRAPH
from test_run_fakes import REPO


def test_import_contracts_hold():
    # the one installed next to this interpreter first: a virtual environment need not be activated
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert exe, "import-linter is a dev dependency: pip install -e '.[dev]'"
    proc = subprocess.run([exe, "--config", str(REPO / "pyproject.toml")], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def _design_table() -> dict[str, tuple[str, str]]:
    text = (REPO / "docs" / "design.md").read_text()
    rows = re.findall(r"^\| (\w+)\s*\| (.+?)\s*\| (.+?)\s*\|$", text, re.M)
    return {stage: (reads, writes) for stage, reads, writes in rows if stage in GRAPH}


def test_design_stage_table_is_the_graph():
    table = _design_table()
    assert list(table) == list(GRAPH)
    for stage, spec in GRAPH.items():
        reads, writes = table[stage]
        assert reads == spec.reads, stage
        assert re.findall(r"`(\w+)`", writes) == list(spec.outputs), stage
        assert all(f"`{name}`" in spec.reads for name in (*spec.inputs, *spec.optional_inputs)), stage
