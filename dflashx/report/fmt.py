"""Human-readable values and tables for reports: the planner's units, '-' for unknown."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dflashx.plan import explain


def human_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB' (the planner's binary units); None -> '-'."""
    return "-" if n is None else explain.human_bytes(n)


def human_seconds(s: float | None) -> str:
    """4000 -> '1.1 h' (the planner's units); None -> '-'."""
    return "-" if s is None else explain.human_seconds(s)


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
