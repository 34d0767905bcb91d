"""`make_plan(recipe, facts) -> Plan`: pure (no file or network I/O, no torch).

The plan holds the findings of every rule, one entry per stage (its commands, estimates and
extras: the typed launch plan for generate (`dflashx.plan.launch`), `deepspeed_config`/`launch` for
train; `StagePlan.runtime()` is what a stage gets when it runs, and `StageRuntime.from_json` reads the
same object back from plan.json), the totals,
their P10/P50/P90 (`ranges`), the recipe with every derived value filled in (`resolved`), which
figures a pilot calibrated (`calibration`), the drafter's predicted serving speed-up at the recipe's
expected tau (`deploy`) and, for `--explain`, the formula and inputs of every
number. The JSON layout is documented in docs/planner.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dflashx.config.schema import STAGE_ORDER, Recipe
from dflashx.plan.context import (
    ESTIMATE_KEYS,
    PlanContext,
    build_context,
    stage_estimates,
    totals,
)
from dflashx.plan.estimates.deployment import deploy_term, expected_speedup
from dflashx.plan.expand.deepspeed import launch
from dflashx.plan.expand.sglang import launch_plan, shell_lines
from dflashx.plan.calibration import PilotCalibration, apply_calibration
from dflashx.plan.explain import Term
from dflashx.plan.findings import Finding, error, warning
from dflashx.plan.launch import LaunchPlan, StageRuntime
from dflashx.plan.ranges import Ranges, plan_ranges
from dflashx.plan.rules import check
from dflashx.resolve import ResolvedRecipe, ResolveError, resolve
from dflashx.targets.facts import registry_facts
from dflashx.targets.registry import REGISTRY, TargetFacts


@dataclass
class StagePlan:
    name: str
    enabled: bool
    commands: list[str] = field(default_factory=list)
    estimates: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ESTIMATE_KEYS, 0.0))
    extra: dict[str, Any] = field(default_factory=dict)
    launch: LaunchPlan | None = None  # generate's servers, router, mode and in-flight counts

    def runtime(self) -> StageRuntime:
        """What the stage gets when it runs (`StageRuntime.from_json(self.to_json())` is the same)."""
        return StageRuntime(float(self.estimates.get("storage_bytes") or 0.0), self.launch)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "enabled": self.enabled, "commands": self.commands,
                "estimates": self.estimates, **(self.launch.to_json() if self.launch else {}), **self.extra}


@dataclass
class Plan:
    findings: list[Finding]
    stages: list[StagePlan]
    totals: dict[str, float]
    resolved: ResolvedRecipe | None  # None when the target is unknown or a value cannot be resolved
    terms: list[Term] = field(default_factory=list)
    ranges: Ranges | None = None
    calibration: dict[str, Any] | None = None  # which figures a pilot measured (apply_calibration's report)
    deploy: dict[str, Any] | None = None  # the drafter's predicted serving speed-up at its expected tau

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    def to_json(self, explain: bool = False) -> dict[str, Any]:
        out = {
            "errors": [f.to_json() for f in self.errors],
            "warnings": [f.to_json() for f in self.warnings],
            "stages": [s.to_json() for s in self.stages],
            "totals": self.totals,
            "ranges": self.ranges.to_json() if self.ranges is not None else None,
            "calibration": self.calibration,
            "resolved": self.resolved.model_dump(mode="json") if self.resolved is not None else None,
            "deploy": self.deploy,
        }
        if explain:
            out["explain"] = [t.to_json() for t in self.terms]
        return out


def _stage_plans(ctx: PlanContext) -> list[StagePlan]:
    recipe = ctx.recipe
    plans = []
    for name in STAGE_ORDER:
        enabled = getattr(recipe.stages, name).enabled
        plans.append(StagePlan(name, enabled, estimates=stage_estimates(ctx, name)))
    by_name = {p.name: p for p in plans}
    serving = launch_plan(ctx.recipe, ctx.facts, ctx.generation.serving)
    by_name["generate"].commands = shell_lines(serving)
    by_name["generate"].launch = serving
    run = launch(recipe)
    by_name["train"].commands = [run["shell"]]
    by_name["train"].extra = {"deepspeed_config": recipe.stages.train.deepspeed_config, "launch": run}
    return plans


def _unresolved(recipe: Recipe, finding: Finding) -> Plan:
    """A plan that stops at resolution: one error finding, zero estimates, nothing resolved."""
    stages = [StagePlan(n, getattr(recipe.stages, n).enabled) for n in STAGE_ORDER]
    return Plan([finding], stages, totals({s.name: s.estimates for s in stages}), None)


def _unknown_target(recipe: Recipe) -> Finding:
    known = ", ".join(sorted(REGISTRY))
    return error("unknown_target", "target.model",
                 f"no facts for target {recipe.target.model!r}: not a registered model, builtin or local folder "
                 "with config.json", f"set target.arch to a known architecture ({known}) or point target.model "
                 "at a folder with config.json (from Python, plan a local folder with "
                 "make_plan(recipe, dflashx.targets.facts.facts_for(recipe.target)))")


def range_findings(ranges: Ranges, recipe: Recipe) -> list[Finding]:
    """Warnings for a budget the P50 plan keeps but its P90 breaks (the P50 is checked by the rules)."""
    b, out = recipe.budget, []
    days = ranges.total.times(1 / 86_400)
    if b.max_days is not None and days.p50 <= b.max_days < days.p90:
        out.append(warning("budget_days_p90", "budget.max_days",
                           f"the plan takes {days.p50:.1f} days at P50 but {days.p90:.1f} at P90, over budget.max_days "
                           f"{b.max_days:g}", "measure before renting: `dflashx pilot` narrows the range"))
    usd = ranges.usd["total"]
    if b.max_usd is not None and usd.p50 <= b.max_usd < usd.p90:
        out.append(warning("budget_usd_p90", "budget.max_usd",
                           f"the plan costs ${usd.p50:,.0f} at P50 but ${usd.p90:,.0f} at P90, over budget.max_usd "
                           f"${b.max_usd:,.0f}", "measure before renting: `dflashx pilot` narrows the range"))
    return out


def make_plan(recipe: Recipe, facts: TargetFacts | None = None,
              calibration: PilotCalibration | None = None) -> Plan:
    """Plan a validated recipe. `facts`: `dflashx.targets.facts.facts_for(recipe.target)`, what the CLI
    passes (a local folder's config.json and tokenizer, else the registry); without them the planner,
    which reads no files, uses that function's registry rule (`registry_facts`) alone, so a local target
    must be given its facts. `calibration` (a pilot's measurements, read by the caller) replaces the
    figures it measured."""
    report = None
    if calibration is not None:
        recipe, report = apply_calibration(recipe, calibration)
    facts = facts or registry_facts(recipe.target)
    if facts is None:
        return _unresolved(recipe, _unknown_target(recipe))
    try:
        resolved = resolve(recipe, facts)
    except ResolveError as e:
        return _unresolved(recipe, error(e.code, e.key, e.message, e.fix))
    ctx = build_context(resolved)
    stages = _stage_plans(ctx)
    ranges = plan_ranges(ctx, (report or {}).get("rse"))
    deploy = expected_speedup(resolved).to_json()
    return Plan([*check(ctx), *range_findings(ranges, recipe)], stages, totals({s.name: s.estimates for s in stages}),
                ctx.recipe, [*ctx.terms, *ranges.terms, deploy_term(deploy)], ranges, report, deploy)


__all__ = ["Plan", "StagePlan", "make_plan"]
