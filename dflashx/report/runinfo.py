"""One finished (or partial) run as the reports read it: recipe, plan, stage states, manifest."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dflashx.plan.estimates.cost import node_usd
from dflashx.plan.context import Estimates
from dflashx.plan.plan import Plan
from dflashx.run.rundir import RunDir
from dflashx.run.status import NotARunDir, StageStatus, run_status
from dflashx.store.manifest import Manifest


@dataclass
class RunInfo:
    path: Path
    run_id: str
    recipe: dict[str, Any]  # the run's saved, resolved recipe (recipe.yaml)
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
        recipe_file = path / "recipe.yaml"
        recipe = yaml.safe_load(recipe_file.read_text()) if recipe_file.is_file() else {}
        return cls(path, (rd.info() or {}).get("run_id", path.name), recipe or {}, plan,
                   stages, Manifest.load(path))

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def profile(self) -> str:
        return str((self.recipe.get("hardware") or {}).get("name", "?"))

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
        """Measured cost: stage duration x GPUs x the profile's $/GPU-hour."""
        duration = self.stages[stage].duration_s if stage in self.stages else None
        if duration is None:
            return None
        hw = self.recipe.get("hardware") or {}
        gpus = int(hw.get("gpus_per_node", 0)) * int(hw.get("nodes", 1))
        return node_usd(duration, gpus, float(hw.get("usd_per_gpu_hour", 0.0)))
