"""`make_plan(recipe, facts) -> Plan`: pure (no file or network I/O, no torch).

The plan holds the findings of every rule, one entry per stage (its commands, typed estimates and launch:
generate's `LaunchPlan` and train's `TrainLaunch`, `dflashx.plan.launch`), the totals, their P10/P50/P90
(`ranges`), the recipe with every derived value filled in (`resolved`: the recipe the estimates came from,
never edited after `resolve`), the train stage's held-out τ interval (`StagePlan.tau_every`, decided by the
train-time estimate: `dflashx.resolve.tau.tau_every`), which figures a pilot calibrated
(`calibration`), the drafter's predicted serving speed-up at the recipe's expected tau (`deploy`) and, for
`--explain`, the formula and inputs of every number. It is one frozen document: `to_json` writes it (the
layout documented in docs/planner.md), `from_json` gives back the same `Plan` (`dflashx.run.rundir.load_plan`
reads a saved plan.json with it), and every reader (the run, its stages, the reports, the CLI) reads its
attributes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dflashx.config.schema import STAGE_ORDER, Recipe
from dflashx.plan.calibration import CalibrationReport, PilotCalibration, apply_calibration
from dflashx.plan.context import Estimates, PlanContext, Totals, build_context, stage_estimates, totals
from dflashx.plan.estimates.deployment import Deployment, deploy_term, expected_speedup
from dflashx.plan.expand.deepspeed import launch
from dflashx.plan.expand.servers import launch_plan, shell_lines
from dflashx.plan.explain import Term
from dflashx.plan.findings import Finding, error, warning
from dflashx.plan.launch import LaunchPlan, TrainLaunch
from dflashx.plan.ranges import Ranges, plan_ranges
from dflashx.plan.rules import check
from dflashx.resolve import ResolvedRecipe, ResolveError, resolve
from dflashx.targets.facts import registry_facts
from dflashx.targets.registry import REGISTRY, TargetFacts


class PlanFileError(ValueError):
    """A plan.json that does not hold a plan (`dflashx.run.rundir.load_plan`): names the file, the key and the fix."""


@dataclass(frozen=True)
class StagePlan:
    """What the plan decided for one stage; a stage reads it as `ctx.runtime`."""

    name: str
    enabled: bool
    commands: tuple[str, ...] = ()  # shell lines for people
    estimates: Estimates = field(default_factory=Estimates)
    launch: LaunchPlan | None = None  # generate's servers, router, mode and in-flight counts
    train_launch: TrainLaunch | None = None  # train's argv, world size, nodes, engine config
    tau_every: int | None = None  # train: the held-out τ interval planned (`Training.tau_every`); else None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "enabled": self.enabled, "commands": list(self.commands),
                "estimates": self.estimates.to_json(), **(self.launch.to_json() if self.launch else {}),
                **(self.train_launch.to_json() if self.train_launch else {}),
                **({"tau_every": self.tau_every} if self.tau_every is not None else {})}

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> StagePlan:
        tau = entry.get("tau_every")  # absent from every stage but train
        return cls(str(entry["name"]), bool(entry["enabled"]), tuple(str(c) for c in entry["commands"]),
                   Estimates.from_json(entry["estimates"]), LaunchPlan.from_json(entry) if "mode" in entry else None,
                   TrainLaunch.from_json(entry) if "launch" in entry else None, None if tau is None else int(tau))


@dataclass(frozen=True)
class Plan:
    findings: tuple[Finding, ...]  # errors first, then warnings
    stages: tuple[StagePlan, ...]  # every stage, in pipeline order
    totals: Totals
    resolved: ResolvedRecipe | None  # None when the target is unknown or a value cannot be resolved
    terms: tuple[Term, ...] = field(default=(), compare=False)  # --explain's view; in plan.json with explain only
    ranges: Ranges | None = None
    calibration: CalibrationReport | None = None  # which figures a pilot measured
    deploy: Deployment | None = None  # the drafter's predicted serving speed-up at its expected tau

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    def stage(self, name: str) -> StagePlan:
        """The plan of stage `name` (every plan has all of them)."""
        return next(s for s in self.stages if s.name == name)

    def to_json(self, explain: bool = False) -> dict[str, Any]:
        out = {
            "errors": [f.to_json() for f in self.errors],
            "warnings": [f.to_json() for f in self.warnings],
            "stages": [s.to_json() for s in self.stages],
            "totals": self.totals.to_json(),
            "ranges": self.ranges.to_json() if self.ranges is not None else None,
            "calibration": self.calibration.to_json() if self.calibration is not None else None,
            "resolved": self.resolved.model_dump(mode="json") if self.resolved is not None else None,
            "deploy": self.deploy.to_json() if self.deploy is not None else None,
        }
        if explain:
            out["explain"] = [t.to_json() for t in self.terms]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        """The `Plan` that `to_json` wrote (a missing key raises KeyError naming it)."""
        ranges, cal, resolved, deploy = data["ranges"], data["calibration"], data["resolved"], data["deploy"]
        return cls(tuple(Finding.from_json(f) for f in [*data["errors"], *data["warnings"]]),
                   tuple(StagePlan.from_json(s) for s in data["stages"]), Totals.from_json(data["totals"]),
                   None if resolved is None else ResolvedRecipe.model_validate(resolved),
                   tuple(Term.from_json(t) for t in data.get("explain", ())),
                   None if ranges is None else Ranges.from_json(ranges),
                   None if cal is None else CalibrationReport.from_json(cal),
                   None if deploy is None else Deployment.from_json(deploy))


def _stage_plans(ctx: PlanContext) -> tuple[StagePlan, ...]:
    recipe, plans = ctx.recipe, []
    serving, train = launch_plan(ctx.recipe, ctx.facts, ctx.generation.serving), launch(recipe)
    for name in STAGE_ORDER:
        enabled, estimates = getattr(recipe.stages, name).enabled, stage_estimates(ctx, name)
        if name == "generate":
            plans.append(StagePlan(name, enabled, tuple(shell_lines(serving)), estimates, launch=serving))
        elif name == "train":
            plans.append(StagePlan(name, enabled, (train.shell,), estimates, train_launch=train,
                                   tau_every=ctx.training.tau_every))
        else:
            plans.append(StagePlan(name, enabled, estimates=estimates))
    return tuple(plans)


def _unresolved(recipe: Recipe, finding: Finding) -> Plan:
    """A plan that stops at resolution: one error finding, zero estimates, nothing resolved."""
    stages = tuple(StagePlan(n, getattr(recipe.stages, n).enabled) for n in STAGE_ORDER)
    return Plan((finding,), stages, totals([s.estimates for s in stages]), None)


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
              calibration: PilotCalibration | None = None, paid: frozenset[str] = frozenset()) -> Plan:
    """Plan a validated recipe. `facts`: `dflashx.targets.facts.facts_for(recipe.target)`, what the CLI
    passes (a local folder's config.json and tokenizer, else the registry); without them the planner,
    which reads no files, uses that function's registry rule (`registry_facts`) alone, so a local target
    must be given its facts. `calibration` (a pilot's measurements, read by the caller) replaces the
    figures it measured. `paid`: the once-per-process fixed parts the process that will run the stages has paid
    (the pilot's, `dflashx.plan.estimates.fixed.process_parts`, when the run follows it in the same process)."""
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
    ctx = build_context(resolved, report.tau_curve if report else (), paid)
    stages = _stage_plans(ctx)
    ranges = plan_ranges(ctx, report.rse if report else None)
    deploy = expected_speedup(resolved)
    found = [*check(ctx), *range_findings(ranges, recipe)]
    findings = tuple(sorted(found, key=lambda f: f.severity != "error"))  # as plan.json lists them
    return Plan(findings, stages, totals([s.estimates for s in stages]), ctx.recipe,
                (*ctx.terms, *ranges.terms, deploy_term(deploy)), ranges, report, deploy)


__all__ = ["Plan", "PlanFileError", "StagePlan", "make_plan"]
