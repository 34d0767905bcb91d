"""One preflight answer, a `dflashx.config.problem.Problem`: `Check(code, key, status ok|warn|fail,
message, fix)` (docs/running.md#preflight)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    """One answer: `code` names the check (`disk`, `source <name>`, `server 0` ...), `key` the recipe
    key it is about ("" when it is about none), `message` what was found, `fix` what to do when not ok."""

    code: str
    key: str
    status: Status
    message: str
    fix: str = ""
