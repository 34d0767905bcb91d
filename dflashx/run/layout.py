"""Where a run's folders are, by convention (no I/O, cheap to import: `dflashx plan` reads it)."""

from __future__ import annotations

from pathlib import Path

from dflashx.config.schema import Recipe

PILOT_DIR = "pilot"  # <run_dir>/pilot/: the pilot's own stage folders and its calibration
CALIBRATION_FILE = "calibration.json"


def default_run_dir(recipe: Recipe) -> Path:
    """`<storage.root>/<recipe.name>`."""
    return Path(recipe.storage.root) / recipe.name


def calibration_path(run_dir: Path) -> Path:
    """The pilot's measurements, which `dflashx plan` of the same recipe applies."""
    return Path(run_dir) / PILOT_DIR / CALIBRATION_FILE
