"""`dflashx plan recipes/qwen36_27b.yaml --explain --json` gives f5ac536's figures (issue 39), except those
issues 37 to 40 changed or moved on purpose (tests/golden/qwen36_27b.f5ac536.md says which and why)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

from golden.figures import figures

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = json.loads((ROOT / "tests" / "golden" / "qwen36_27b.f5ac536.json").read_text())


def _plan_document() -> dict:
    proc = subprocess.run([sys.executable, "-m", "dflashx.cli.main", "plan", "recipes/qwen36_27b.yaml", "--explain",
                           "--json"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def test_the_seeds_plan_gives_f5ac536s_figures() -> None:
    document = _plan_document()
    now = dict(figures(document))
    golden = GOLDEN["figures"]
    assert sorted(set(golden) - set(now)) == [], "figures gone: update the golden file and its note"
    # the explanation, generated from the expressions, may name more operands than f5ac536's text did; any
    # other new figure is a change of the plan and belongs in the golden file
    new = [k for k in set(now) - set(golden) if not re.fullmatch(r"explain\[[\w.]+\]\.inputs\.[\w.]+", k)]
    assert sorted(new) == [], "figures added: update the golden file and its note"
    moved = {k: (golden[k], now[k]) for k in golden if not math.isclose(now[k], golden[k], rel_tol=1e-9, abs_tol=1e-12)}
    assert moved == {}


def test_every_figure_changed_since_f5ac536_names_its_issue() -> None:
    for entry in (*GOLDEN["updated"].values(), *GOLDEN["added"].values(), *GOLDEN.get("moved", {}).values()):
        assert entry["issue"] in (37, 38, 39, 40) and entry["why"]
    for old, entry in GOLDEN.get("moved", {}).items():  # a figure moved keeps its value under its new key
        assert old not in GOLDEN["figures"] and entry["to"] in GOLDEN["figures"]
    for key, entry in GOLDEN["updated"].items():
        assert not math.isclose(entry["f5ac536"], GOLDEN["figures"][key], rel_tol=1e-9)


def test_every_explained_number_has_generated_text() -> None:
    document = _plan_document()
    for term in document["explain"]:
        assert term["formula"], term["key"]
