"""Explained numbers: every estimate carries its formula, inputs and source for `--explain`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dflashx.plan.expr import Expr, Named


@dataclass(frozen=True)
class Term:
    """One derived number: `value` in `unit`, computed by `formula` from `inputs`. The formula and inputs are
    rendered when first read (`explain`: a plan renders them only for --explain and plan.json's `explain`; its
    P10/P90 re-plans never do)."""

    key: str
    value: float
    unit: str
    explain: Callable[[], tuple[str, dict[str, Any]]] = field(compare=False, repr=False)
    source: str = ""

    @cached_property
    def _explained(self) -> tuple[str, dict[str, Any]]:
        return self.explain()

    @property
    def formula(self) -> str:
        return self._explained[0]

    @property
    def inputs(self) -> dict[str, Any]:
        return self._explained[1]

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "unit": self.unit, "formula": self.formula,
                "inputs": self.inputs, "source": self.source}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Term:
        formula, inputs = str(data["formula"]), dict(data["inputs"])
        return cls(str(data["key"]), float(data["value"]), str(data["unit"]), lambda: (formula, inputs),
                   str(data["source"]))


def term(key: str, value: float, unit: str, formula: str, source: str = "", **inputs: Any) -> Term:
    """A term whose formula is text (a measured figure, a model computed elsewhere); inputs as keywords."""
    return Term(key, value, unit, lambda: (formula, inputs), source)


def explained(key: str, expr: Expr, unit: str, source: str = "", **context: Any) -> Term:
    """The term of a number computed by `expr` (`dflashx.plan.expr`): its value, formula and inputs all read off
    the one expression; `context` adds what the formula does not compute with (notes, labels, the figures a
    reader compares it with)."""
    return Term(key, expr.value, unit, lambda: (expr.formula(), {**expr.inputs(), **context}), source)


def explained_parts(key: str, value: float, unit: str, *parts: Named, source: str = "", **context: Any) -> Term:
    """A term whose formula is several named expressions side by side (a band's P10 and P90 around `value`):
    "p10 = ...; p90 = ...", each part's value and operands its inputs, as `explained` renders one."""

    def render() -> tuple[str, dict[str, Any]]:
        inputs: dict[str, Any] = {p.name: p.value for p in parts}
        for p in parts:
            inputs |= {k: v for k, v in p.inputs().items() if k not in inputs}
        return "; ".join(f"{p.name} = {p.formula()}" for p in parts), inputs | context

    return Term(key, value, unit, render, source)


def human_bytes(n: float) -> str:
    """Binary units (TiB) like the seeds' storage figures."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_seconds(s: float) -> str:
    if s >= 86_400:
        return f"{s / 86_400:.1f} d"
    if s >= 3_600:
        return f"{s / 3_600:.1f} h"
    if s >= 60:
        return f"{s / 60:.1f} min"
    if s >= 1 or s == 0:
        return f"{s:.1f} s"
    return f"{s * 1000:.1f} ms"


def human_count(n: float) -> str:
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}"
    return f"{n:.0f}"
