"""`dflashx run` and `dflashx pilot` as one pipeline: plan → preflight → pilot → stages → summary,
and the policy between the steps. The CLI parses, calls `run_recipe` / `pilot_recipe` and prints.

`run_recipe(request, view)`:
  1. plan       `make_plan` with the pilot's calibration (`RunRequest.calibration`); any plan error
                stops the run, except the `budget.*` ones with `continue_over_budget` (the policies
                between the steps are `dflashx.run.policy`'s: `blocking`, `budget_breaks`, `pilot_due`,
                `retrain_lr`);
  2. preflight  the checks of the selected stages (`dflashx.run.preflight`), unless skipped; a
                failed check stops the run;
  3. pilot      first when `generate` is selected, the pilot is not skipped and `pilot_due` says
                so (`pilot.enabled`; auto: on a GPU profile, until the generation is finished or a
                pilot measured it under the recipe's values), under the run lock the stages then run
                under (one lock for the whole run). Its re-plan stops the run on errors,
                and on broken budgets unless `continue_over_budget`; the stages then run with it;
  4. stages     the run folder's recipe.yaml and plan.json (`describe_run`: the plan the stages run
                under), then `run_pipeline` over the selection;
  5. summary    `Session`: the run's result, its plan, and the retrain hint (`train.lr` / 5 when
                training is enabled: the first thing to try when the loss does not fall).
`pilot_recipe(request, view)` is steps 1 to 3 for `dflashx pilot` (every plan error stops it: the
pilot re-plans from a plan without errors); the run folder is described by the run's plan.

A stop is `Stopped` (message, exit code, the findings behind it); what the person watching sees
goes to the `SessionView` handed in, so `run/` never prints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from dflashx.config.schema import Recipe
from dflashx.plan.calibration import PilotCalibration
from dflashx.plan.findings import Finding
from dflashx.plan.pilot import PILOT_STAGES
from dflashx.plan.plan import Plan, make_plan
from dflashx.resolve.model import ResolvedRecipe
from dflashx.run.check import Check
from dflashx.run.graph import Selection, select
from dflashx.run.layout import default_run_dir
from dflashx.run.observer import RunObserver
from dflashx.run.orchestrator import RunResult, describe_run, run_pipeline
from dflashx.run.pilot import PilotFailed, PilotOutcome, run_pilot
from dflashx.run.policy import BUDGET_CODES, blocking, budget_breaks, pilot_due, retrain_lr
from dflashx.run.preflight import preflight, stages_to_check
from dflashx.run.rundir import RunDir, RunDirBusy
from dflashx.targets.registry import TargetFacts

PilotFn = Callable[[Recipe, Plan, Path, RunObserver, IO[str], Iterable[str]], PilotOutcome]


class SessionView(RunObserver, Protocol):
    """What a session shows besides the stages (`RunObserver`): progress lines, the plan's
    findings, the preflight's answers and what the pilot measured."""

    def line(self, text: str) -> None: ...
    def findings(self, findings: Sequence[Finding]) -> None: ...
    def preflight(self, checks: Sequence[Check]) -> None: ...
    def pilot_measured(self, outcome: PilotOutcome) -> None: ...


class Stopped(Exception):
    """The session stopped before or while running: `message` says why and what to do, `findings`
    the plan errors behind it; `exit_code` 1 (130 when `interrupted`)."""

    def __init__(self, message: str, findings: Sequence[Finding] = (), interrupted: bool = False):
        super().__init__(message)
        self.message, self.findings, self.interrupted = message, list(findings), interrupted
        self.exit_code = 130 if interrupted else 1


@dataclass(frozen=True)
class RunRequest:
    """One `dflashx run` (or `dflashx pilot`): the loaded recipe and what the command line asked."""

    recipe: Recipe
    source: Path  # the recipe file, named in the messages
    facts: TargetFacts | None
    calibration: PilotCalibration | None = None  # <run dir>/pilot/calibration.json, when a pilot ran
    run_dir: Path | None = None  # default: <storage.root>/<recipe name>
    selection: Selection = field(default_factory=select)
    preflight: bool = True
    pilot: bool = True
    continue_over_budget: bool = False
    argv: Sequence[str] = ()


@dataclass(frozen=True)
class Session:
    """A finished `run_recipe`: the stages' outcomes, the plan they ran under, the retrain hint."""

    result: RunResult
    plan: Plan
    run_dir: Path
    retrain_lr: float | None  # a smaller train.lr to try next; None when training is disabled

    @property
    def ok(self) -> bool:
        return self.result.ok


def _plan(request: RunRequest, view: SessionView, budget_flag: bool, nothing: str) -> tuple[Plan, ResolvedRecipe]:
    """Plan the recipe, its findings to the view; Stopped on an error, except a budget.* one when
    `budget_flag` (the command takes --continue-over-budget) and the request continues over budget."""
    made = make_plan(request.recipe, request.facts, request.calibration)
    view.findings([*made.warnings, *made.errors])
    stops = blocking(made, budget_flag and request.continue_over_budget)
    if made.resolved is None or stops:
        hint = budget_flag and any(f.code in BUDGET_CODES for f in stops)
        raise Stopped(f"{request.source}: the plan has {len(stops)} error(s); {nothing}"
                      + (" (--continue-over-budget goes on over budget.*)" if hint else ""))
    return made, made.resolved


def _preflight(request: RunRequest, view: SessionView, resolved: ResolvedRecipe, plan: Plan, run_dir: Path,
               stages: Sequence[str], force: Iterable[str]) -> None:
    """The preflight checks for `stages`, answers to the view; Stopped on a failed check."""
    view.line("preflight: checking the data, target, tokenizer, disk and servers…")
    checks = preflight(resolved, plan, run_dir, stages_to_check(resolved, run_dir, stages, force))
    view.preflight(checks)
    if any(c.status == "fail" for c in checks):
        raise Stopped(f"{request.source}: the preflight failed; nothing was run (fix the above, or --skip-preflight)")


def _hold(run_dir: Path, what: str) -> IO[str]:
    """The run lock, held for everything this session runs in `run_dir` (the pilot and the stages)."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    try:
        return RunDir(Path(run_dir).resolve()).lock()
    except RunDirBusy as e:
        raise Stopped(f"{what}{e}") from None


def _pilot(request: RunRequest, view: SessionView, made: Plan, run_dir: Path, held: IO[str],
           pilot: PilotFn) -> tuple[Plan, ResolvedRecipe]:
    """Run the pilot of the session's plan, its figures to the view; the re-plan, or Stopped when the
    pilot failed, the re-plan has errors or (without `continue_over_budget`) breaks the budget."""
    recipe = request.recipe
    view.line(f"pilot: {recipe.pilot.prompts} prompts, {recipe.pilot.train_steps} training steps "
              f"(pilot.* in the recipe), to measure what the plan assumed")
    try:
        outcome = pilot(recipe, made, run_dir, view, held, request.argv)
    except PilotFailed as e:
        raise Stopped(f"pilot: {e}") from None
    except KeyboardInterrupt:
        raise Stopped("interrupted: the completions written are kept; the pilot (or the run) continues after them",
                      interrupted=True) from None
    view.pilot_measured(outcome)
    after = outcome.after
    others = blocking(after, over_budget_ok=True)
    if others or after.resolved is None:
        raise Stopped("stopped: with the pilot's figures the plan has errors:", others)
    breaks = "\n".join(f"  {b}" for b in budget_breaks(after))
    if breaks and not request.continue_over_budget:
        raise Stopped(f"stopped: with the pilot's figures the plan breaks the budget:\n{breaks}\n"
                      "raise budget.*, change the recipe, or run again with --continue-over-budget")
    if breaks:
        view.line(f"over budget, continuing (--continue-over-budget):\n{breaks}")
    view.line(f"pilot: wrote {outcome.path}; `dflashx plan` of this recipe now uses it")
    return after, after.resolved


def run_recipe(request: RunRequest, view: SessionView, on_progress: Callable[[Path], object] | None = None,
               pilot: PilotFn = run_pilot) -> Session:
    """Plan, check, pilot and run `request` (see the module docstring); `on_progress` is handed to
    the orchestrator (PROGRESS.md), `pilot` is the pilot to run when one is due."""
    made, resolved = _plan(request, view, True, "nothing was run")
    run_dir = request.run_dir or default_run_dir(resolved)
    view.line(f"run dir: {run_dir}")
    selection = request.selection
    if request.preflight:
        _preflight(request, view, resolved, made, run_dir, selection.stages, selection.force)
    held = _hold(run_dir, "")
    try:
        describe_run(run_dir, made)
        if (request.pilot and "generate" in selection.stages
                and pilot_due(request.recipe, run_dir, request.calibration)):
            made, resolved = _pilot(request, view, made, run_dir, held, pilot)
            describe_run(run_dir, made)  # the re-plan the stages run under
        result = run_pipeline(resolved, made, run_dir, selection, argv=request.argv, observer=view,
                              on_progress=on_progress, held=held)
    except KeyboardInterrupt:
        raise Stopped("interrupted: run the same command again to resume", interrupted=True) from None
    finally:
        held.close()
    return Session(result, made, run_dir, retrain_lr(resolved.stages.train))


def pilot_recipe(request: RunRequest, view: SessionView, pilot: PilotFn = run_pilot) -> Plan:
    """`dflashx pilot`: plan (every error stops it), preflight for the stages the pilot uses, the
    pilot; its re-plan (see `_pilot` for when it stops)."""
    made, resolved = _plan(request, view, False, "no pilot was run")
    run_dir = request.run_dir or default_run_dir(resolved)
    view.line(f"run dir: {run_dir}")
    if request.preflight:
        _preflight(request, view, resolved, made, run_dir, PILOT_STAGES, ())
    held = _hold(run_dir, "pilot: ")
    try:
        describe_run(run_dir, made)
        return _pilot(request, view, made, run_dir, held, pilot)[0]
    finally:
        held.close()
