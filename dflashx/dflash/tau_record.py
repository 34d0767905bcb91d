"""What the train stage hands on about held-out τ: the curve, the best and the last measurement.

`checkpoint/tau.json` (`HeldOutTau`, beside the last drafter's config.json + model.safetensors in the
train stage's `checkpoint` artifact) holds every measurement of the run, the best (highest τ, the newest
of equal ones: the trainer's `best-tau/` folder) and the last (the final step's). When the best is not
the last, the best drafter is in `checkpoint/best/` (the same DFlash layout) and `exported` says `best`:
the export stage exports that one (`HeldOutTau.drafter_dir`). No torch here: report/ reads the record
too.

Public API: `TAU_FILE`, `BEST_DIR`, `TauPoint`, `HeldOutTau` (`.read(folder)`, `.drafter_dir(folder)`,
`.write(folder)`, `.summary()`), `metrics_file(stage_dir)` (the train stage's logs/metrics.jsonl: one line per log
step and per held-out τ measurement), `tau_row(point, **figures)`, `is_tau_row(row)`, `curve_of(metrics_file)`
(its τ lines); `TauPoint` and `curve_text(points)` (as findings and reports quote a
curve) come from `dflashx.resolve.tau`, where the planner reads them too.
"""

# No `from __future__ import annotations`: pydantic evaluates the annotations when the class is created.

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dflashx.resolve.tau import TauPoint
from dflashx.store.atomic import atomic_write_text

TAU_FILE = "tau.json"
BEST_DIR = "best"
TAU_KEY = "heldout_tau"  # the metric name in logs/metrics.jsonl, the stage's records and W&B


def metrics_file(stage_dir: Path) -> Path:
    """The train stage's metrics log under its folder: one JSON line per log step and per held-out τ measurement."""
    return Path(stage_dir) / "logs" / "metrics.jsonl"


class HeldOutTau(BaseModel):
    """The run's held-out τ curve and which drafter the train stage hands on for export."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompts: int = Field(ge=1, description="Held-out prompts per measurement.")
    max_new_tokens: int = Field(ge=1)
    curve: list[TauPoint] = Field(description="Every measurement, by step.")
    best: TauPoint
    last: TauPoint
    exported: Literal["best", "last"] = Field(description="`best` when the best is not the last step's drafter: "
                                              "it is in best/ and the export stage exports it.")

    @classmethod
    def of(cls, curve: list[TauPoint], best: TauPoint, prompts: int, max_new_tokens: int) -> "HeldOutTau":
        last = curve[-1]
        return cls(prompts=prompts, max_new_tokens=max_new_tokens, curve=curve, best=best, last=last,
                   exported="best" if best.step != last.step else "last")

    @classmethod
    def read(cls, checkpoint: Path) -> "HeldOutTau | None":
        """The record in a train stage's checkpoint folder; None when τ was not measured."""
        file = Path(checkpoint) / TAU_FILE
        return cls.model_validate_json(file.read_text()) if file.is_file() else None

    def write(self, checkpoint: Path) -> None:
        atomic_write_text(Path(checkpoint) / TAU_FILE, self.model_dump_json(indent=2) + "\n")

    def drafter_dir(self, checkpoint: Path) -> Path:
        """The folder of the drafter to export: best/ when the best is not the last, else the checkpoint."""
        return Path(checkpoint) / BEST_DIR if self.exported == "best" else Path(checkpoint)

    @classmethod
    def handed_on(cls, checkpoint: Path) -> Path:
        """The folder of the drafter the train stage hands on, which the eval stage measures and the export
        stage exports: `drafter_dir` when τ was measured, else the checkpoint."""
        record = cls.read(checkpoint)
        return record.drafter_dir(checkpoint) if record is not None else Path(checkpoint)

    def summary(self) -> dict[str, Any]:
        """The train stage's metrics about it: the curve as [step, τ] pairs, the best and what is handed on."""
        return {"heldout_tau_curve": [[p.step, p.tau] for p in self.curve], "heldout_tau_best": self.best.tau,
                "heldout_tau_best_step": self.best.step, "heldout_tau_last": self.last.tau,
                "exported_checkpoint": self.exported}


def tau_row(point: TauPoint, **figures: Any) -> dict[str, Any]:
    """Its line in logs/metrics.jsonl (and the metrics logged): step, `heldout_tau` and the other figures."""
    return {"step": point.step, TAU_KEY: point.tau, **figures}


def is_tau_row(row: dict[str, Any]) -> bool:
    return TAU_KEY in row


def curve_of(metrics_file: Path) -> list[TauPoint]:
    """The τ measurements logged in a metrics.jsonl, by step."""
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines()] if metrics_file.is_file() else []
    return [TauPoint(step=r["step"], tau=r[TAU_KEY]) for r in rows if is_tau_row(r)]
