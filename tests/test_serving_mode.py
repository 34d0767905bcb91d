"""Issue 30: who runs the target for generation (`spawn | attach | in-process`) is resolved once,
`dflashx.resolve.serving.serving_mode` into `stages.generate.serving.mode`, before every rule and
estimate that needs it; the launch plan, the estimate's server count, the preflight and the pilot read
that value, and no module outside resolve/ decides it again (a source scan)."""

from __future__ import annotations

import re

import pytest
from _plan_recipes import seeds_recipe
from test_run_fakes import REPO

from dflashx.plan.context import build_context
from dflashx.plan.plan import make_plan
from dflashx.resolve import resolve
from dflashx.targets.registry import lookup

QWEN36 = lookup("Qwen/Qwen3.6-27B")
CPU = {"hardware__gpu": None, "hardware__gpus_per_node": 0, "hardware__cpu_tflops": 0.1}
ADDRESSES = ["http://10.0.0.5:30000/v1", "http://10.0.0.6:30000"]

CASES = [
    # (recipe, resolved mode, replicas the estimate counts)
    (seeds_recipe("h200_x1", **CPU, stages__generate__backend="transformers"), "in-process", 1),
    (seeds_recipe("h200_x1", **CPU, stages__generate__urls=ADDRESSES), "attach", 1),
    (seeds_recipe("h200_x1", **CPU, stages__generate__urls=ADDRESSES, stages__generate__serving__tp=2,
                  stages__generate__serving__dp=4), "attach", 1),  # no GPU: one process, whatever the recipe says
    (seeds_recipe("h200_x1", **CPU), "spawn", 1),  # an error (sglang_needs_gpu): nothing to start
    (seeds_recipe("b200_nvl8"), "spawn", 8),
    (seeds_recipe("h100_x8", hardware__nodes=2), "spawn", 16),
    (seeds_recipe("b200_nvl8", stages__generate__urls=ADDRESSES), "attach", 8),
    (seeds_recipe("b200_nvl8", stages__generate__backend="transformers"), "in-process", 8),
]


@pytest.mark.parametrize(("recipe", "mode", "replicas"), CASES)
def test_the_resolved_mode_the_launch_plan_and_the_estimate_agree(recipe, mode, replicas):
    resolved = resolve(recipe, QWEN36)
    serving = resolved.stages.generate.serving
    assert serving.mode == mode
    estimate = build_context(resolved).generation.serving
    assert (estimate.tp, estimate.dp) == (serving.tp, serving.dp)  # the estimate re-defaults nothing
    assert serving.dp == replicas
    plan = make_plan(recipe, QWEN36)
    launch = next(s for s in plan.stages if s.name == "generate").launch
    assert launch is not None and launch.mode == mode
    in_flight = sum(s.in_flight for s in launch.servers)
    if mode == "in-process":
        assert launch.servers == ()
    elif mode == "attach":
        assert len(launch.servers) == len(ADDRESSES) and in_flight == launch.in_flight_per_replica * estimate.dp
        assert all(not s.command for s in launch.servers)
    elif recipe.hardware.gpu is None:
        assert launch.servers == () and "sglang_needs_gpu" in {f.code for f in plan.errors}
    else:  # every replica the estimate counts is a launched server's
        assert all(s.command for s in launch.servers)
        assert in_flight == launch.in_flight_per_replica * estimate.dp
    codes = {f.code for f in plan.errors + plan.warnings}
    assert ("servers_on_other_nodes" in codes) == (mode == "spawn" and recipe.hardware.nodes > 1)


# a decision about the mode: the generation backend compared, `urls` tested for emptiness
BACKEND = re.compile(r"backend\s*[!=]=\s*[\"'](?:sglang|transformers)[\"']")
URLS = re.compile(r"\b(?:not|if|and|or)\s+[\w.]*\burls\b")


def decides(line: str) -> bool:
    return bool(BACKEND.search(line) or URLS.search(_code(line)))


def _code(line: str) -> str:
    """The line without its string literals' text (messages name `stages.generate.urls`) and comment."""
    return re.sub(r"\"[^\"]*\"|'[^']*'", '""', line).split("#")[0]


def test_no_module_outside_resolve_decides_the_mode_again():
    offenders = [f"{path.relative_to(REPO)}:{n}: {line.strip()}"
                 for path in sorted((REPO / "dflashx").rglob("*.py")) if "resolve" not in path.parts
                 for n, line in enumerate(path.read_text().splitlines(), 1) if decides(line)]
    assert offenders == []
    assert decides('if gen.backend == "sglang" and not gen.urls:')  # the scan sees the old forms
    assert decides("    if hw.gpu is None or recipe.stages.generate.urls:")
    assert not decides('    raise X("the plan lists no servers and stages.generate.urls is empty")')
