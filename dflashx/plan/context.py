"""Everything the rules and the stage expansion look at: the recipe, target facts and estimates."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Self

from dflashx.resolve.tau import TauPoint
from dflashx.plan.estimates.cost import gpu_hours, usd
from dflashx.plan.estimates.fixed import fixed_costs
from dflashx.plan.estimates.generation import Generation, estimate_generation
from dflashx.plan.estimates.host import eval_seconds, host_seconds
from dflashx.plan.estimates.lengths import Lengths, OutputLengths
from dflashx.plan.estimates.memory import (
    StageMemory,
    eval_memory,
    serving_memory,
    training_memory,
)
from dflashx.plan.estimates.storage import Storage, estimate_storage
from dflashx.plan.estimates.tokens import Tokens, count_tokens
from dflashx.plan.estimates.training import Training, estimate_training
from dflashx.plan.explain import Term
from dflashx.resolve.model import ResolvedRecipe
from dflashx.targets.registry import TargetFacts


@dataclass(frozen=True)
class PlanContext:
    recipe: ResolvedRecipe
    lengths: Lengths  # the output-length distribution every estimate and rule reads
    tokens: Tokens
    generation: Generation
    training: Training
    storage: Storage
    memory: dict[str, StageMemory]  # stage -> peak per-GPU memory
    seconds: dict[str, float]  # stage -> wall time (its work + its fixed costs)
    time_terms: tuple[Term, ...]  # how the host-bound and eval times and the fixed costs were derived
    pilot_tau: tuple[TauPoint, ...] = ()  # held-out τ a pilot measured under these training values (none: empty)

    @property
    def facts(self) -> TargetFacts:
        return self.recipe.target.facts

    @property
    def terms(self) -> list[Term]:
        """Every explained number, in pipeline order."""
        return [
            *self.tokens.terms, *self.generation.terms, *self.training.terms, *self.storage.terms,
            *(m.term for m in self.memory.values()), *self.time_terms,
        ]


def build_context(recipe: ResolvedRecipe, pilot_tau: tuple[TauPoint, ...] = (),
                  paid: frozenset[str] = frozenset()) -> PlanContext:
    """The estimates of `recipe`; `pilot_tau`: the held-out τ curve a pilot measured (`CalibrationReport.tau_curve`),
    for the rules only; `paid`: the once-per-process fixed parts the process that runs the stages paid before them
    (`dflashx.plan.estimates.fixed.process_parts` of its pilot's recipe)."""
    facts = recipe.target.facts
    lengths = OutputLengths.of(recipe.dataset.stats)
    tokens = count_tokens(recipe, recipe.stages.train.max_length, lengths)
    gen = estimate_generation(recipe, tokens, lengths)
    train = estimate_training(recipe, tokens, lengths)
    storage = estimate_storage(recipe, tokens, train)
    memory = {
        "generate": serving_memory(recipe, facts, tokens, gen.serving),
        "train": training_memory(recipe, train),
        "eval": eval_memory(recipe, train),
    }
    time_terms = {
        **host_seconds(recipe, tokens, storage.total, storage.by_artifact.get("export.drafter", 0.0)),
        "eval": eval_seconds(recipe, gen.serving),
    }
    seconds = {stage: t.value for stage, t in time_terms.items()}
    seconds.update(generate=gen.seconds, train=train.seconds)
    fixed = fixed_costs(recipe, train.steps, paid)  # a stage's time: its work + its fixed costs
    for stage, s in fixed.seconds.items():
        seconds[stage] = seconds.get(stage, 0.0) + s
    return PlanContext(recipe, lengths, tokens, gen, train, storage, memory, seconds,
                       (*time_terms.values(), *fixed.terms.values()), pilot_tau)


@dataclass(frozen=True)
class Estimates:
    """One stage's five estimates (plan.json's `estimates` entry); zeros for a disabled stage."""

    seconds: float = 0.0  # wall time
    gpu_hours: float = 0.0  # billed: wall time x every GPU of the profile
    usd: float = 0.0
    storage_bytes: float = 0.0  # what the stage writes locally
    peak_gpu_memory_bytes: float = 0.0  # per GPU (host memory on the CPU profile)

    def to_json(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        """From `to_json`'s dict (a missing field raises KeyError naming it)."""
        return cls(**{f.name: float(data[f.name]) for f in fields(cls)})


@dataclass(frozen=True)
class Totals(Estimates):
    """The sums over stages (they run one after another), peak memory the maximum, and `days`."""

    days: float = 0.0


ESTIMATE_KEYS = tuple(f.name for f in fields(Estimates))


def stage_estimates(ctx: PlanContext, stage: str) -> Estimates:
    """The five estimate fields of one stage; zeros for a disabled stage."""
    if not getattr(ctx.recipe.stages, stage).enabled:
        return Estimates()
    hw = ctx.recipe.hardware
    seconds = ctx.seconds.get(stage, 0.0)
    memory = ctx.memory.get(stage)
    return Estimates(seconds, gpu_hours(seconds, hw), usd(seconds, hw), ctx.storage.for_stage(stage),
                     memory.bytes if memory else 0.0)


def totals(per_stage: list[Estimates]) -> Totals:
    """Sums over stages (they run one after another); peak memory is the maximum."""
    sums = {key: sum(getattr(e, key) for e in per_stage) for key in ESTIMATE_KEYS}
    sums["peak_gpu_memory_bytes"] = max((e.peak_gpu_memory_bytes for e in per_stage), default=0.0)
    return Totals(**sums, days=sums["seconds"] / 86_400)
