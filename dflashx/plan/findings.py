"""A planner finding: what is wrong (or risky), which recipe key, and how to fix it (a
`dflashx.config.problem.Problem` with a severity)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Severity = Literal["error", "blocking", "warning"]


@dataclass(frozen=True)
class Finding:
    code: str
    key: str
    message: str
    fix: str
    severity: Severity = "error"

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Finding:
        return cls(str(data["code"]), str(data["key"]), str(data["message"]), str(data["fix"]), data["severity"])


def error(code: str, key: str, message: str, fix: str) -> Finding:
    return Finding(code, key, message, fix, "error")


def warning(code: str, key: str, message: str, fix: str) -> Finding:
    return Finding(code, key, message, fix, "warning")


def blocking(code: str, key: str, message: str, fix: str) -> Finding:
    """A mistake that wastes the rented node's time: an error unless the recipe lists the code
    under `acknowledge` (reviewed in the pull request), then a warning."""
    return Finding(code, key, message, fix, "blocking")


def acknowledged(findings: list[Finding], codes: list[str]) -> list[Finding]:
    """Blocking findings become errors, or warnings when their code is acknowledged."""
    out = []
    for f in findings:
        if f.severity != "blocking":
            out.append(f)
        elif f.code in codes:
            out.append(Finding(f.code, f.key, f"{f.message} (acknowledged in the recipe)", f.fix, "warning"))
        else:
            fix = f"{f.fix}; or accept it on purpose: `acknowledge: [{f.code}]` in the recipe"
            out.append(Finding(f.code, f.key, f.message, fix, "error"))
    return out
