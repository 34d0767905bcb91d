"""A planner finding: what is wrong (or risky), which recipe key, and how to fix it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Finding:
    code: str
    key: str
    message: str
    fix: str
    severity: Severity = "error"

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def error(code: str, key: str, message: str, fix: str) -> Finding:
    return Finding(code, key, message, fix, "error")


def warning(code: str, key: str, message: str, fix: str) -> Finding:
    return Finding(code, key, message, fix, "warning")
