"""One preflight answer: `Check(name, status ok|warn|fail, detail, fix)` (docs/running.md#preflight)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    """One answer: `detail` names the recipe key it is about, `fix` what to do when not ok."""

    name: str
    status: Status
    detail: str
    fix: str = ""
