"""The run directory: its files, the per-stage `_STARTED` / `_SUCCESS` markers and the run lock.

    <run_dir>/run.json            {run_id, recipe, created_at}: the pipeline run's identity (W&B group)
    <run_dir>/recipe.yaml         resolved recipe, redacted
    <run_dir>/plan.json           the plan, redacted
    <run_dir>/.lock               held (flock) by the `dflashx run` using the dir
    <run_dir>/<stage>/_STARTED    JSON {stage_key, started_at, key_leaves}: the attempt writing here
    <run_dir>/<stage>/_SUCCESS    JSON {stage_key, finished_at, duration_s, key_leaves}: written last
`key_leaves` ({version, leaves: {dotted key or "input <artifact>": digest}}, from
`dflashx.run.keydiff.key_leaves`) lets the next run say which keys changed.
A stage folder persists across killed runs; only `_SUCCESS` says it is complete. A folder whose
`_STARTED` or `_SUCCESS` key differs from the current key is moved to `<stage>.superseded-<key8>`.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import yaml
from pydantic import ValidationError

from dflashx.plan.plan import Plan, PlanFileError
from dflashx.store.manifest import Manifest, atomic_write_json, atomic_write_text, utc_now

RUN_FILE, RECIPE_FILE, PLAN_FILE, LOCK_FILE = "run.json", "recipe.yaml", "plan.json", ".lock"
STARTED, SUCCESS = "_STARTED", "_SUCCESS"


def load_plan(path: str | Path) -> Plan:
    """The plan saved at `path` (a run's plan.json, `Plan.from_json`); `PlanFileError` names what is wrong with it."""
    fix = "plan again: `dflashx run` rewrites the run's plan.json (or `dflashx plan RECIPE --json > FILE`)"
    try:
        return Plan.from_json(json.loads(Path(path).read_text()))
    except json.JSONDecodeError as e:
        raise PlanFileError(f"{path}: not JSON ({e}); {fix}") from None
    except KeyError as e:
        raise PlanFileError(f"{path}: key {e} is missing, so this is not a dflashx plan (or one from an "
                            f"older dflashx); {fix}") from None
    except (TypeError, ValueError, ValidationError) as e:
        raise PlanFileError(f"{path}: a value does not fit the plan: {e}; {fix}") from None


class RunDirBusy(RuntimeError):
    """Another `dflashx run` holds the run directory."""


@dataclass
class RunDir:
    path: Path

    def stage_dir(self, stage: str) -> Path:
        return self.path / stage

    # ------------------------------------------------------------------ identity and saved inputs

    def ensure(self, recipe_name: str) -> str:
        """Create the run dir (if needed) and return its run id (made once, kept in run.json)."""
        self.path.mkdir(parents=True, exist_ok=True)
        info = self.info()
        if info is None:
            stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
            info = {"run_id": f"{recipe_name}-{stamp}", "recipe": recipe_name, "created_at": utc_now()}
            atomic_write_json(self.path / RUN_FILE, info)
        return info["run_id"]

    def info(self) -> dict[str, Any] | None:
        return _read_json(self.path / RUN_FILE)

    def save_recipe(self, redacted_recipe: dict[str, Any]) -> Path:
        atomic_write_text(self.path / RECIPE_FILE, yaml.safe_dump(redacted_recipe, sort_keys=False, allow_unicode=True))
        return self.path / RECIPE_FILE

    def save_plan(self, redacted_plan: dict[str, Any]) -> Path:
        atomic_write_json(self.path / PLAN_FILE, redacted_plan)
        return self.path / PLAN_FILE

    def plan(self) -> Plan | None:
        """The saved plan (`load_plan`: `PlanFileError` for a plan.json that holds none); None without one."""
        path = self.path / PLAN_FILE
        return load_plan(path) if path.is_file() else None

    # ------------------------------------------------------------------ markers

    def started(self, stage: str) -> dict[str, Any] | None:
        return _read_json(self.stage_dir(stage) / STARTED)

    def success(self, stage: str) -> dict[str, Any] | None:
        return _read_json(self.stage_dir(stage) / SUCCESS)

    def mark_started(self, stage: str, key: str, leaves: dict[str, Any] | None = None) -> None:
        atomic_write_json(self.stage_dir(stage) / STARTED,
                          {"stage_key": key, "started_at": utc_now()} | _leaves(leaves))

    def mark_success(self, stage: str, key: str, duration_s: float, leaves: dict[str, Any] | None = None) -> None:
        atomic_write_json(self.stage_dir(stage) / SUCCESS, {"stage_key": key, "finished_at": utc_now(),
                                                            "duration_s": round(duration_s, 3)} | _leaves(leaves))

    def supersede(self, stage: str, old_key: str) -> str:
        """Move the stage folder aside; returns the new folder name (relative to the run dir)."""
        base = f"{stage}.superseded-{old_key[:8]}"
        name, n = base, 1
        while (self.path / name).exists():
            n += 1
            name = f"{base}-{n}"
        os.replace(self.stage_dir(stage), self.path / name)
        return name

    # ------------------------------------------------------------------ lock

    def lock(self) -> IO[str]:
        """Hold the run dir for this process (released on close or death); RunDirBusy if taken."""
        handle = open(self.path / LOCK_FILE, "a+", encoding="utf-8")  # noqa: SIM115 - held until the run ends
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise RunDirBusy(f"another `dflashx run` (pid {holder}) is using {self.path}; "
                             "wait for it or stop it") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        return handle

    def is_locked(self) -> bool:
        """Whether some process holds the run lock now."""
        if not (self.path / LOCK_FILE).exists():
            return False
        with open(self.path / LOCK_FILE, "a+", encoding="utf-8") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
            return False


def set_aside(rundir: RunDir, name: str, key: str, manifest: Manifest, forced: bool = False) -> tuple[str, str] | None:
    """Move the stage folder aside when it holds another key's attempt (or a forced finished one) and
    mark its artifacts garbage; (old key, new folder name), or None when the folder is resumed."""
    if not rundir.stage_dir(name).exists():
        return None
    marker = rundir.success(name) or rundir.started(name)
    old_key = (marker or {}).get("stage_key")
    if old_key is None or (old_key == key and not (forced and rundir.success(name))):
        return None  # resume into the same folder
    moved = rundir.supersede(name, old_key)
    if not manifest.supersede(name, moved):
        manifest.register(name, f"partial@{moved}", moved, "garbage", hash_content=False,
                          stage_key=old_key, description="unfinished output of an outdated attempt")
    manifest.save()
    return old_key, moved


def moved_line(name: str, old_key: str, moved: str) -> str:
    return f"~ {name}: outputs of key {old_key[:12]} moved to {moved}/ (garbage; `dflashx gc` deletes it)"


def _leaves(leaves: dict[str, Any] | None) -> dict[str, Any]:
    return {} if leaves is None else {"key_leaves": leaves}


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
