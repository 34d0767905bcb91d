"""The contract every stage implements.

A stage is one function `run(ctx: StageContext) -> StageResult` in `dflashx/stages/<name>.py`.
It reads its resolved config from `ctx.config` (its section of the `ResolvedRecipe` in `ctx.recipe`, typed:
a stage's `run` takes its own `StageContext[section]`, named below as `TrainContext` and so on, which mypy
checks every read against; tests/test_stage_context.py holds each `run`'s annotation to its section's type),
what the plan decided for it from `ctx.runtime` (its frozen `StagePlan`: typed estimates and, for
generate and train, the typed launch; never the planner's JSON) and its inputs from `ctx.inputs` (the outputs of
earlier stages, keyed "<stage>.<artifact>"), writes only inside `ctx.out_dir`, and returns the
artifacts it produced (paths relative to `ctx.out_dir`) and its measured metrics. The orchestrator
(`dflashx.run`) owns everything around it: the run directory, stage keys, `_SUCCESS` markers,
records, provenance, W&B and the manifest. A stage that must stop the run (QC failing) raises
`StageFailed` with a plain-words message.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generic, Protocol, TypeVar, cast

from dflashx.config.fields import StageBase
from dflashx.config.schema import STAGE_ORDER, Tier
from dflashx.config.stages import BackupStage, ExportStage, IngestStage, QCStage, TokenizeStage
from dflashx.plan.plan import StagePlan
from dflashx.resolve.model import ResolvedEvalStage, ResolvedGenerateStage, ResolvedRecipe, ResolvedTrainStage


class StageFailed(RuntimeError):
    """A stage ran but its result must stop the pipeline (e.g. the QC gate)."""

    def __init__(self, message: str, metrics: dict[str, Any] | None = None):
        super().__init__(message)
        self.metrics = metrics or {}


class MetricLogger(Protocol):
    def __call__(self, metrics: dict[str, Any], step: int | None = None) -> None: ...


@dataclass
class Artifact:
    """One output of a stage. `path` is relative to the stage folder."""

    path: str
    tier: Tier = "replaceable"  # recipes may override (storage.tiers)
    description: str = ""


C = TypeVar("C", bound=StageBase)


@dataclass
class StageContext(Generic[C]):
    """What stage `name` runs with; `C` is the type of its resolved section (`config`)."""

    name: str
    recipe: ResolvedRecipe  # every derived value filled in; stages never re-default a recipe value
    runtime: StagePlan  # what the plan decided for this stage, typed (`Plan.stage(name)`)
    run_dir: Path
    out_dir: Path  # this stage's folder; persists across resumes until _SUCCESS
    inputs: dict[str, Path] = field(default_factory=dict)  # "<stage>.<artifact>" -> absolute path
    log: MetricLogger = lambda metrics, step=None: None

    @property
    def config(self) -> C:
        """This stage's section of the resolved recipe (`ResolvedTrainStage` for train, ...): the one place a
        section is looked up by the stage's name, so the type is the annotation's (checked by the test above)."""
        return cast(C, getattr(self.recipe.stages, self.name))


IngestContext = StageContext[IngestStage]
GenerateContext = StageContext[ResolvedGenerateStage]
QCContext = StageContext[QCStage]
TokenizeContext = StageContext[TokenizeStage]
TrainContext = StageContext[ResolvedTrainStage]
EvalContext = StageContext[ResolvedEvalStage]
ExportContext = StageContext[ExportStage]
BackupContext = StageContext[BackupStage]


@dataclass
class StageResult:
    artifacts: dict[str, Artifact] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    # set when the stage stopped at a limit of the recipe with work left (stages.generate.max_prompts /
    # max_minutes): the orchestrator then registers nothing and writes no _SUCCESS; the next attempt resumes
    unfinished: str | None = None


StageFn = Callable[[StageContext[Any]], StageResult]


def load_stage(name: str) -> StageFn:
    """Import `dflashx.stages.<name>.run` lazily (so planning never imports torch)."""
    if name not in STAGE_ORDER:
        raise KeyError(f"unknown stage {name!r}; stages are {', '.join(STAGE_ORDER)}")
    module = importlib.import_module(f"dflashx.stages.{name}")
    return module.run
