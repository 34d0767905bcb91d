"""`dflashx compare`: runs side by side — recipe differences, estimate vs actual, key results.

Everything comes from the run folders (recipe.yaml, plan.json, records.jsonl, manifest.json, and
the eval stage's eval/report/eval.json for tau per suite and drafter, per prompt source and per
context bucket, and the predicted serving speed-up per concurrency).
When a run tracked online (`tracking.mode: online`) and WANDB_API_KEY is set, metrics missing
locally are filled from the W&B API (runs of the pipeline run's group, one per stage = job type).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

from dflashx.config.schema import STAGE_ORDER
from dflashx.config.tree import flatten
from dflashx.dflash.acceptance import CONTEXT_BUCKET_LABELS
from dflashx.report.fmt import Section, human_bytes, human_seconds, human_value
from dflashx.report.runinfo import RunInfo

log = logging.getLogger(__name__)

RESULT_STAGES = ("generate", "qc", "train", "eval")  # stages whose scalar metrics are "key results"
THROUGHPUT = {"generate": "output_tokens_per_s", "tokenize": "tokens_per_s", "train": "tokens_per_s",
              "eval": "tokens_per_s"}


def recipe_differences(runs: list[RunInfo]) -> Section:
    flat = [flatten(r.recipe.model_dump(mode="json")) for r in runs]
    keys = sorted(set().union(*flat))
    rows = [[k, *(human_value(f.get(k)) for f in flat)] for k in keys
            if len({repr(f.get(k)) for f in flat}) > 1]
    return Section("Recipe differences", ["key", *(r.name for r in runs)], rows,
                   "" if rows else "The runs' resolved recipes are identical.")


def _ratio(actual: float | None, estimate: float | None, fmt: Callable[[float | None], str]) -> str:
    if actual is None:
        return f"- / {fmt(estimate)}"
    ratio = f" ({actual / estimate:.2f}x)" if estimate else ""
    return f"{fmt(actual)} / {fmt(estimate)}{ratio}"


def _usd(v: float | None) -> str:
    return "-" if v is None else f"{v:,.2f}"


def estimate_vs_actual(runs: list[RunInfo]) -> list[Section]:
    headers = ["stage", *(r.name for r in runs)]
    time = Section("Time: actual / estimate", headers)
    storage = Section("Storage: actual / estimate", headers)
    cost = Section("Cost (USD): actual / estimate", headers, note="actual = duration x GPUs x $/GPU-hour")
    speed = Section("Throughput (tokens/s)", headers)
    for stage in STAGE_ORDER:
        est = [r.estimates(stage) for r in runs]
        time.rows.append([stage, *(_ratio(r.stages[stage].duration_s if stage in r.stages else None,
                                          e.seconds, human_seconds) for r, e in zip(runs, est))])
        storage.rows.append([stage, *(_ratio(r.storage(stage), e.storage_bytes, human_bytes)
                                      for r, e in zip(runs, est))])
        cost.rows.append([stage, *(_ratio(r.usd(stage), e.usd, _usd) for r, e in zip(runs, est))])
        if stage in THROUGHPUT:
            speed.rows.append([stage, *(human_value(r.metrics(stage).get(THROUGHPUT[stage])) for r in runs)])
    return [time, storage, cost, speed]


def key_results(runs: list[RunInfo], remote: list[dict[str, dict[str, Any]]] | None = None) -> Section:
    """Scalar metrics of the result stages, one row per metric (W&B values fill local gaps)."""
    values: list[dict[str, Any]] = []
    for i, run in enumerate(runs):
        merged: dict[str, Any] = {}
        for stage in RESULT_STAGES:
            stage_metrics = {**(remote[i].get(stage, {}) if remote else {}), **run.metrics(stage)}
            merged.update({f"{stage}.{k}": v for k, v in stage_metrics.items()
                           if isinstance(v, (int, float)) and not isinstance(v, bool)})
        values.append(merged)
    keys = sorted(set().union(*values), key=lambda k: (RESULT_STAGES.index(k.split(".")[0]), k))
    return Section("Key results", ["metric", *(r.name for r in runs)],
                   [[k, *(human_value(v.get(k)) for v in values)] for k in keys])


EVAL_REPORT = ("eval", "report", "eval.json")
OVERALL = "overall"


def eval_report(run: RunInfo) -> dict[str, Any]:
    """The run's eval.json ({} when the eval stage has not written one or it is unreadable)."""
    try:
        data = json.loads(run.path.joinpath(*EVAL_REPORT).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _tau_cell(trained: dict[str, Any] | None, untrained: dict[str, Any] | None) -> str:
    if not trained:
        return "-"
    base = human_value((untrained or {}).get("tau"))
    return f"{human_value(trained.get('tau'))} / {base} ({trained.get('prompts', '-')} prompts)"


def eval_groups(runs: list[RunInfo], key: str, title: str, order: tuple[str, ...] = ()) -> Section:
    """tau of each run's eval per group of `key` (`by_source`, `by_context`), side by side: trained /
    untrained (prompts); "-" where a run has no such group (or no eval report with groups)."""
    reports = [eval_report(r) for r in runs]
    groups = [((rep.get("trained") or {}).get(key) or {}, (rep.get("untrained") or {}).get(key) or {})
              for rep in reports]
    found = set().union(*(t for t, _ in groups))
    labels = [n for n in order if n in found] + sorted(found - set(order))
    rows = [[OVERALL, *(_tau_cell(rep.get("trained"), rep.get("untrained")) if t else "-"
                        for rep, (t, _) in zip(reports, groups))]] if labels else []
    rows += [[n, *(_tau_cell(t.get(n), u.get(n)) for t, u in groups)] for n in labels]
    note = ("tau (tokens per target forward) of the trained / untrained drafter, from eval/report/eval.json"
            if rows else "No run has an eval report with these figures.")
    return Section(title, ["group", *(r.name for r in runs)], rows, note)


def suite_table(report: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """An eval.json's {suite: {drafter: summary}}; a report from before suites existed holds one
    suite, the held-out prompts, with its trained and untrained drafters."""
    if isinstance(report.get("suites"), dict):
        return report["suites"]
    old = {d: report[d] for d in ("trained", "untrained") if isinstance(report.get(d), dict)}
    return {"heldout": old} if old else {}


def eval_suites(runs: list[RunInfo]) -> Section:
    """tau of every drafter on every suite, runs side by side: one row per (suite, drafter)."""
    tables = [suite_table(eval_report(r)) for r in runs]
    rows: list[list[str]] = []
    for suite in dict.fromkeys(s for t in tables for s in t):
        for drafter in dict.fromkeys(d for t in tables for d in t.get(suite, {})):
            cells = [(t.get(suite) or {}).get(drafter) for t in tables]
            rows.append([suite, drafter, *(f"{human_value(c.get('tau'))} ({c.get('prompts', '-')} prompts)" if c
                                           else "-" for c in cells)])
    note = ("tau (tokens per target forward) per suite and drafter, from eval/report/eval.json" if rows
            else "No run has an eval report.")
    return Section("Eval tau per suite and drafter", ["suite", "drafter", *(r.name for r in runs)], rows, note)


def _speedup_cell(row: dict[str, Any] | None) -> str:
    if not row:
        return "-"
    return (f"{row['speedup']:.2f}x ({human_value(row['tokens_per_second'])} -> "
            f"{human_value(row['tokens_per_second_drafter'])} tok/s)")


def predicted_speedup(runs: list[RunInfo]) -> Section:
    """Each run's predicted serving speed-up (eval.json `predicted_speedup`) per concurrency, side by side."""
    predictions = [eval_report(r).get("predicted_speedup") or {} for r in runs]
    by_run = [{row["concurrency"]: row for row in p.get("rows", [])} for p in predictions]
    concurrencies = sorted(set().union(*by_run))
    rows = [["tau, profile", *(f"{p['tau']:.2f} on {p['profile']}" if p else "-" for p in predictions)]] \
        if concurrencies else []
    rows += [[f"{c} in flight", *(_speedup_cell(b.get(c)) for b in by_run)] for c in concurrencies]
    note = ("tokens/s per server with the trained drafter / without it, predicted from the eval's acceptance by "
            "position on each run's hardware profile (eval/report/eval.json)" if rows
            else "No run has a predicted speed-up (eval/report/eval.json).")
    return Section("Predicted serving speed-up", ["", *(r.name for r in runs)], rows, note)


def wandb_metrics(run: RunInfo) -> dict[str, dict[str, Any]]:
    """Per-stage W&B summaries of an online run ({} when offline, without a key, or unreachable)."""
    tracking = run.recipe.tracking
    if tracking.mode != "online" or not os.environ.get("WANDB_API_KEY"):
        return {}
    try:
        import wandb

        path = "/".join(p for p in (tracking.entity, tracking.project) if p)
        found = wandb.Api(timeout=20).runs(path, filters={"group": run.run_id})
        return {r.job_type: {k: v for k, v in dict(r.summary).items() if not k.startswith("_")}
                for r in found if r.job_type}
    except Exception as exc:  # noqa: BLE001 - network, auth, a deleted project: local records answer
        log.warning("W&B API unavailable for %s (%s); using local records only", run.run_id, exc)
        return {}


def compare(runs: list[RunInfo]) -> list[Section]:
    """Every section of the comparison, in reading order."""
    overview = Section("Runs", ["run", "run id", "profile", "stages done"],
                       [[r.name, r.run_id, r.profile,
                         f"{sum(s.state == 'done' for s in r.stages.values())}/{len(r.stages)}"]
                        for r in runs])
    remote = [wandb_metrics(r) for r in runs]
    return [overview, recipe_differences(runs), *estimate_vs_actual(runs),
            key_results(runs, remote if any(remote) else None), eval_suites(runs),
            eval_groups(runs, "by_source", "Eval tau per source"),
            eval_groups(runs, "by_context", "Eval tau by prompt length (tokens)", CONTEXT_BUCKET_LABELS),
            predicted_speedup(runs)]
