"""recipe -> resolve -> ResolvedRecipe: every derived value computed once, by one function, typed.

Pure (no torch, no I/O). `formulas` and `flops` are the shared formulas (layer spread, γ,
schedule, the FLOP model); `deepspeed` builds the engine config and launch command; `model`
holds `ResolvedRecipe`; `resolve.resolve(recipe, facts)` builds it.
"""

from dflashx.resolve.model import (
    ResolvedDrafter, ResolvedGenerateStage, ResolvedRecipe, ResolvedServing, ResolvedTarget, ResolvedTrainStage,
)
from dflashx.resolve.resolve import ResolveError, resolve

__all__ = ["ResolveError", "ResolvedDrafter", "ResolvedGenerateStage", "ResolvedRecipe", "ResolvedServing",
           "ResolvedTarget", "ResolvedTrainStage", "resolve"]
