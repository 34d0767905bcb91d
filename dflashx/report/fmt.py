"""Human-readable values and tables for reports: the planner's units, '-' for unknown."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from dflashx.plan import explain

if TYPE_CHECKING:
    from rich.console import Console

    from dflashx.plan.ranges import Band

OFF_TTY_WIDTH = 1000  # off a terminal rich tables take their natural width, up to this


def wide_console(file: IO[str] | None = None, **kwargs: Any) -> Console:
    """A rich Console: on a terminal, as usual; off one (a pipe, a file, CliRunner), no colour and
    wide enough that tables keep their natural width (`dflashx inventory RUN | cat` shows whole cells)."""
    from rich.console import Console

    probe = Console(file=file, **kwargs)
    if probe.is_terminal:
        return probe
    return Console(file=file, width=max(OFF_TTY_WIDTH, probe.width), no_color=True, **kwargs)


def human_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB' (the planner's binary units); None -> '-'."""
    return "-" if n is None else explain.human_bytes(n)


def human_seconds(s: float | None) -> str:
    """4000 -> '1.1 h' (the planner's units); None -> '-'."""
    return "-" if s is None else explain.human_seconds(s)


def band_text(band: Band | None, fmt: Callable[[float], str]) -> str:
    """`P10 – P90` of a plan range in `fmt`'s units (`dflashx plan`, pilot and review); `-` without one."""
    return "-" if band is None else f"{fmt(band.p10)} – {fmt(band.p90)}"


def human_value(v: Any) -> str:
    """Metric values: floats to 4 significant digits, None as '-', the rest as str."""
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


@dataclass
class Section:
    """A titled table, rendered as markdown (PR comments, files) or with rich (terminal)."""

    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    note: str = ""

    def markdown(self, level: int = 3) -> str:
        lines = [f"{'#' * level} {self.title}", ""]
        if self.note:
            lines += [self.note, ""]
        if self.rows:
            lines.append("| " + " | ".join(self.headers) + " |")
            lines.append("|" + "---|" * len(self.headers))
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in self.rows]
            lines.append("")
        return "\n".join(lines)

    def rich(self) -> Any:
        from rich.table import Table

        table = Table(title=self.title, caption=self.note or None)
        for i, header in enumerate(self.headers):
            table.add_column(header, no_wrap=i == 0)
        for row in self.rows:
            table.add_row(*row)
        return table

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "headers": self.headers, "rows": self.rows, "note": self.note}


def suite_taus(by_suite: dict[str, dict[str, float]]) -> str:
    """`τ per suite: heldout 3.94/1.00, tiny-eval 4.17/1.00 (trained/untrained)` from the eval stage's
    `tau_by_suite`; empty when it adds nothing to the headline (one suite, trained and untrained)."""
    drafters = list(next(iter(by_suite.values()), {}))
    if len(by_suite) < 2 and set(drafters) <= {"trained", "untrained"}:
        return ""
    shown = lambda tau: "-" if tau is None else f"{tau:.2f}"  # noqa: E731 - as the headline's τ
    cells = [f"{suite} " + "/".join(shown(taus.get(d)) for d in drafters) for suite, taus in by_suite.items()]
    return f"τ per suite: {', '.join(cells)} ({'/'.join(drafters)})"


TAU_CURVE_SHOWN = 6  # points of a held-out τ curve a headline shows (the first, the last and evenly between)


def tau_curve(curve: list[list[float]]) -> str:
    """`held-out τ 1.00@32 → 3.52@160 → 4.11@320` from the train stage's `heldout_tau_curve` ([step, τ] pairs),
    at most TAU_CURVE_SHOWN points."""
    if not curve:
        return ""
    n = len(curve)
    picks = sorted({round(i * (n - 1) / (TAU_CURVE_SHOWN - 1)) for i in range(TAU_CURVE_SHOWN)}) if n > 1 else [0]
    return "held-out τ " + " → ".join(f"{curve[i][1]:.2f}@{int(curve[i][0])}" for i in picks)


def exported_drafter(which: str) -> str:
    """The export stage's `exported`: which of the train stage's drafters it exported."""
    return {"best": "exported the best held-out τ drafter", "last": "exported the last drafter"}.get(which, which)
