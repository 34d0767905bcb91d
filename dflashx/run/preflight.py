"""Preflight: check the world a recipe's run needs before its first stage (docs/running.md#preflight).

One `Check(code, key, status ok|warn|fail, message, fix)` per question: sources, datasets ids, target config
and tokenizer (`checks_inputs`), disk, S3, GPUs, attached servers (`checks_node`), the engine a run launches
and its release (`checks_engine`). Each check runs in
a thread under one deadline; an exception becomes a `fail` naming the check.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path

from dflashx.config.schema import STAGE_ORDER, Recipe
from dflashx.plan.plan import Plan
from dflashx.resolve.model import ResolvedRecipe
from dflashx.run.check import Check, Status
from dflashx.run.checks_engine import check_engine, launched_engines
from dflashx.run.checks_inputs import check_source, check_target, check_tokenizer
from dflashx.run.checks_node import check_disk, check_gpus, check_s3, check_server
from dflashx.run.keys import stage_key
from dflashx.run.rundir import RunDir
from dflashx.store.manifest import Manifest

__all__ = ["Check", "check_disk", "check_gpus", "check_plan", "check_s3", "check_server", "check_source",
           "check_target", "check_tokenizer", "preflight", "stages_to_check"]

DEFAULT_TIMEOUT_S = 60.0
TARGET_STAGES = {"generate", "qc", "tokenize", "train", "eval", "export"}
GPU_STAGES = {"generate", "train", "eval"}


def check_plan(plan: Plan) -> Check:
    """The plan's own findings, as `dflashx plan` lists them (the first one here)."""
    findings = plan.errors or plan.warnings
    if not findings:
        return Check("plan", "", "ok", "no plan errors or warnings")
    first, kind = findings[0], "error" if plan.errors else "warning"
    return Check("plan", first.key, "fail" if plan.errors else "warn", f"{len(findings)} plan {kind}(s); first: "
                 f"{first.key}: {first.message}", first.fix or "see `dflashx plan RECIPE`")


def stages_to_check(recipe: Recipe, run_dir: Path, stages: Sequence[str], force: Iterable[str] = ()) -> list[str]:
    """`stages` less those a run would skip as done (their `_SUCCESS` holds the current key)."""
    if not isinstance(recipe, ResolvedRecipe) or not (Path(run_dir) / "manifest.json").is_file():
        return list(stages)
    try:
        manifest, rundir = Manifest.load(run_dir), RunDir(Path(run_dir))
        return [s for s in stages if s in force or not (done := rundir.success(s))
                or done.get("stage_key") != stage_key(s, recipe, manifest).key]
    except (OSError, ValueError, KeyError):
        return list(stages)


def _bounded(jobs: list[tuple[str, Callable[[], Check], Status]], timeout_s: float) -> list[Check]:
    """Each job in a daemon thread; past the deadline a job gets its slow status, an exception a fail."""
    results: list[Check | None] = [None] * len(jobs)

    def work(i: int, name: str, fn: Callable[[], Check]) -> None:
        try:
            results[i] = fn()
        except Exception as exc:  # noqa: BLE001 - a check that crashes is a failed check
            results[i] = Check(name, "", "fail", f"{name}: the check failed: {type(exc).__name__}: {exc}",
                               "fix the cause above; `dflashx run --skip-preflight` runs without the preflight")

    threads = [threading.Thread(target=work, args=(i, name, fn), daemon=True) for i, (name, fn, _) in enumerate(jobs)]
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [r if r is not None else Check(name, "", slow, f"{name}: no answer within {timeout_s:g} s",
                                          "check the network and the endpoint, then retry")
            for r, (name, _, slow) in zip(list(results), jobs)]


def preflight(recipe: Recipe, plan: Plan, run_dir: Path, stages: Sequence[str] = STAGE_ORDER,
              timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Check]:
    """The checks the enabled `stages` need, in order (the plan's own errors: `check_plan`). Pass the
    plan's `ResolvedRecipe` when it has one (its mask token is checked), else the `Recipe`."""
    wanted = set(stages) & {s for s in STAGE_ORDER if getattr(recipe.stages, s).enabled}
    mask_id = getattr(recipe.drafter, "mask_token_id", None)
    jobs: list[tuple[str, Callable[[], Check], Status]] = []
    if "ingest" in wanted:
        jobs += [(f"source {s.name}", partial(check_source, i, s),
                  "warn") for i, s in enumerate(recipe.dataset.sources)]
    if wanted & TARGET_STAGES:
        jobs += [("target", partial(check_target, recipe.target, mask_id), "warn"),
                 ("tokenizer", partial(check_tokenizer, recipe.target, mask_id), "warn")]
    jobs.append(("disk", partial(check_disk, recipe.storage.root, plan.totals, Path(run_dir)), "fail"))
    if "backup" in wanted and recipe.storage.s3 is not None:
        jobs.append(("s3", partial(check_s3, recipe.storage.s3, recipe.name), "fail"))
    if wanted & GPU_STAGES:
        jobs.append(("gpus", partial(check_gpus, recipe.hardware, plan.totals), "fail"))
    served = plan.resolved.stages.generate.serving if plan.resolved is not None else None
    if "generate" in wanted and served is not None and served.mode == "attach":
        jobs += [(f"server {i}", partial(check_server, i, u, recipe.target.model), "fail")
                 for i, u in enumerate(recipe.stages.generate.urls)]
    if plan.resolved is not None:
        jobs += [(f"engine {engine}", partial(check_engine, plan.resolved, engine, key, drafter), "fail")
                 for engine, key, drafter in launched_engines(plan.resolved)
                 if key.split(".")[1] in wanted]
    return _bounded(jobs, timeout_s)
