"""Rules about the drafter's architecture: its own checks of its keys against the target's shapes and the block
(`ArchitectureSpec.checks`, e.g. DFlash2's: a group size that divides the hidden size), and keys of another
architecture that the named one would ignore."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from dflashx.config.architectures import REGISTRY, architecture
from dflashx.config.architectures.spec import Shapes
from dflashx.plan.context import PlanContext
from dflashx.plan.findings import Finding, error, warning

Rule = Callable[[PlanContext], Iterable[Finding]]


def other_keys_unused(ctx: PlanContext) -> Iterable[Finding]:
    """Keys of another architecture changed from their defaults: the named architecture has no such modules."""
    d = ctx.recipe.drafter
    for spec in REGISTRY.values():
        if spec is architecture(d.architecture):
            continue
        changed = [k for k, info in spec.keys.model_fields.items() if getattr(d, k) != info.default]
        if changed:
            yield warning(f"{spec.name}_keys_unused", f"drafter.{changed[0]}",
                          f"drafter.{', drafter.'.join(changed)} set, but drafter.architecture is {d.architecture}, "
                          f"which has no {spec.name} modules: the keys change nothing",
                          f"set drafter.architecture: {spec.name}, or drop the {spec.name} keys")


def architecture_checks(ctx: PlanContext) -> Iterable[Finding]:
    """The named architecture's own checks of its keys (its entry's `checks`)."""
    d = ctx.recipe.drafter
    spec = architecture(d.architecture)
    shapes = Shapes(d.num_layers, ctx.facts.hidden_size, ctx.facts.vocab_size, d.block_size)
    for issue in spec.checks(spec.keys_of(d), shapes, d.precision):
        make = error if issue.severity == "error" else warning
        yield make(issue.code, issue.key, issue.message, issue.fix)


DRAFTER_RULES: tuple[Rule, ...] = (other_keys_unused, architecture_checks)
