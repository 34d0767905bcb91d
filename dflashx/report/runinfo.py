"""One finished (or partial) run as the reports read it: the typed plan (and in it the resolved recipe), stage
states, manifest. Nothing here reads recipe.yaml or re-derives a figure: the plan's `resolved` is the recipe the
run ran (plan.json and recipe.yaml are written from it, both redacted), and a cost is `plan.estimates.cost`'s."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflashx.plan.estimates.cost import usd
from dflashx.plan.context import Estimates
from dflashx.plan.plan import Plan
from dflashx.resolve.model import ResolvedRecipe
from dflashx.run.rundir import RunDir
from dflashx.run.status import NotARunDir, StageStatus, run_status
from dflashx.store.manifest import Manifest


@dataclass
class RunInfo:
    path: Path
    run_id: str
    plan: Plan  # plan.json (`run.rundir.load_plan`)
    stages: dict[str, StageStatus]
    manifest: Manifest

    @classmethod
    def load(cls, run_dir: str | Path) -> RunInfo:
        """Read a run directory; ValueError (naming the folder) when it is not one."""
        path = Path(run_dir)
        rd = RunDir(path)
        try:
            stages = {s.name: s for s in run_status(path)}
        except NotARunDir as exc:
            raise ValueError(str(exc)) from None
        plan = rd.plan()
        assert plan is not None, "run_status reads plan.json first"
        return cls(path, (rd.info() or {}).get("run_id", path.name), plan, stages, Manifest.load(path))

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def recipe(self) -> ResolvedRecipe:
        """The recipe the run ran, resolved (a run folder's plan always holds it: `run_status` says so)."""
        assert self.plan.resolved is not None, "run_status refuses a plan.json without `resolved`"
        return self.plan.resolved

    @property
    def profile(self) -> str:
        return self.recipe.hardware.name

    def metrics(self, stage: str) -> dict[str, Any]:
        status = self.stages.get(stage)
        return status.metrics if status else {}

    def estimates(self, stage: str) -> Estimates:
        return self.plan.stage(stage).estimates

    def storage(self, stage: str) -> int | None:
        """Bytes of the stage's live artifacts, None when it registered none."""
        entries = self.manifest.by_stage(stage)
        return sum(e.size for e in entries) if entries else None

    def usd(self, stage: str) -> float | None:
        """Measured cost: the stage's duration at the plan's price of the whole node (`cost.usd`)."""
        duration = self.stages[stage].duration_s if stage in self.stages else None
        if duration is None:
            return None
        return usd(duration, self.recipe.hardware)
