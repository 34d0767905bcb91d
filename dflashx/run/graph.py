"""Which stages a `dflashx run` invocation selects (--only / --until / --force); the graph itself
is declared in `dflashx.stages.graph`."""

from __future__ import annotations

from dataclasses import dataclass, field

from dflashx.config.schema import STAGE_ORDER
from dflashx.config.suggest import did_you_mean


@dataclass
class Selection:
    """Which stages to consider this invocation, and which to re-run even when done."""

    stages: list[str] = field(default_factory=list)
    force: set[str] = field(default_factory=set)


def _check(name: str, flag: str) -> None:
    if name not in STAGE_ORDER:
        close = did_you_mean(name, STAGE_ORDER)
        hint = f" ({close})" if close else ""
        raise ValueError(f"{flag} {name!r}: unknown stage{hint}; stages are {', '.join(STAGE_ORDER)}")


def select(only: str | None = None, until: str | None = None, force: tuple[str, ...] | list[str] = ()) -> Selection:
    """Stages in pipeline order: all, `--only` one, or up to and including `--until`."""
    if only and until:
        raise ValueError("give --only or --until, not both")
    for flag, name in (("--only", only), ("--until", until), *(("--force", f) for f in force)):
        if name:
            _check(name, flag)
    if only:
        stages = [only]
    elif until:
        stages = list(STAGE_ORDER[: STAGE_ORDER.index(until) + 1])
    else:
        stages = list(STAGE_ORDER)
    outside = [f for f in force if f not in stages]
    if outside:
        raise ValueError(f"--force {', '.join(outside)}: not among the stages this run selects ({', '.join(stages)})")
    return Selection(stages=stages, force=set(force))
