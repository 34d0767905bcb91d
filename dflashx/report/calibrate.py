"""`dflashx calibrate`: fit the planner's per-profile efficiency factors from finished runs.

- `serving_ratio` = measured output tokens/s (generate's `output_tokens_per_s`) / the serving
  model's prediction for the same recipe: the plan's `generate.tokens_per_second` divided by the
  calibration ratio that plan applied (its `calibration` input), so the fit is right whether or
  not the run itself was planned with a calibrated ratio.
- `training_mfu` = the MFU the trainer measured (train's `mfu` metric: achieved model FLOP/s over
  the profile's peak, the same definition the planner's training estimate divides by).
Several runs of one profile are combined by their median; values are clipped to (0, 1].
`--write` stores them as `hardware_profiles/<profile>.calibration.yaml` ({calibrated: {...}}),
which `load_recipe` merges into `HardwareProfile.calibrated`; `dflashx plan` then marks those
factors as calibrated.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dflashx.config.load import CALIBRATION_SUFFIX, available_profiles
from dflashx.config.schema import Recipe
from dflashx.plan.estimates.device import CALIBRATED_MFU, CALIBRATED_SERVING
from dflashx.plan.plan import make_plan
from dflashx.report.fmt import Section, human_value
from dflashx.report.runinfo import RunInfo
from dflashx.store.manifest import atomic_write_text, utc_now

FactsFor = Callable[[Recipe], Any]  # recipe -> TargetFacts | None (the CLI's target_facts)


@dataclass
class Fit:
    run: str
    profile: str
    factor: str
    used: float  # the factor the plan used
    planned: float  # the plan's figure (tokens/s, or MFU)
    measured: float
    fitted: float


@dataclass
class Calibration:
    fits: list[Fit] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def factors(self) -> dict[str, dict[str, float]]:
        """{profile: {factor: median of the fits, clipped to (0, 1]}}."""
        grouped: dict[str, dict[str, list[float]]] = {}
        for f in self.fits:
            grouped.setdefault(f.profile, {}).setdefault(f.factor, []).append(f.fitted)
        return {p: {k: round(min(statistics.median(v), 1.0), 4) for k, v in fs.items()}
                for p, fs in grouped.items()}

    def sections(self) -> list[Section]:
        fits = Section("Fits per run", ["run", "profile", "factor", "plan used", "planned", "measured",
                                        "fitted"],
                       [[f.run, f.profile, f.factor, human_value(f.used), human_value(f.planned),
                         human_value(f.measured), human_value(f.fitted)] for f in self.fits],
                       "; ".join(self.notes))
        factors = Section("Calibrated factors (median per profile)", ["profile", "factor", "value"],
                          [[p, k, human_value(v)] for p, fs in self.factors.items() for k, v in fs.items()])
        return [fits, factors]


def _planned_terms(recipe: Recipe, facts_for: FactsFor) -> dict[str, dict[str, Any]]:
    plan = make_plan(recipe, facts_for(recipe)).to_json(explain=True)
    return {t["key"]: t for t in plan.get("explain", [])}


def fit_run(run: RunInfo, facts_for: FactsFor, into: Calibration) -> None:
    """Add the run's fits (or a note saying why there are none) to `into`."""
    try:
        recipe = Recipe.model_validate(run.recipe)
    except ValidationError as exc:
        into.notes.append(f"{run.name}: recipe.yaml does not validate ({exc.error_count()} error(s)); skipped")
        return
    terms = _planned_terms(recipe, facts_for)
    profile = recipe.hardware.name
    measured_tps = run.metrics("generate").get("output_tokens_per_s")
    serving = terms.get("generate.tokens_per_second")
    if measured_tps and serving and serving["value"] > 0:
        used = float(serving["inputs"]["calibration"])
        into.fits.append(Fit(run.name, profile, CALIBRATED_SERVING, used, serving["value"],
                             float(measured_tps), used * float(measured_tps) / serving["value"]))
    else:
        into.notes.append(f"{run.name}: no measured generate throughput")
    measured_mfu = run.metrics("train").get("mfu")
    training = terms.get("train.seconds")
    if measured_mfu and training:
        used = float(training["inputs"]["mfu"])
        into.fits.append(Fit(run.name, profile, CALIBRATED_MFU, used, used, float(measured_mfu),
                             float(measured_mfu)))
    else:
        into.notes.append(f"{run.name}: no measured training MFU")


def calibrate(runs: list[RunInfo], facts_for: FactsFor) -> Calibration:
    result = Calibration()
    for run in runs:
        fit_run(run, facts_for, result)
    return result


def calibration_path(profile: str) -> Path:
    """Where `profile`'s calibration file goes: next to the profile's YAML."""
    known = available_profiles()
    if profile not in known:
        raise ValueError(f"hardware profile {profile!r} has no file in the profile folders "
                         f"({', '.join(sorted(known))}); calibrate runs of a named profile")
    return known[profile].with_name(profile + CALIBRATION_SUFFIX)


def write_calibration(profile: str, factors: dict[str, float], runs: list[str]) -> Path:
    """Merge `factors` into the profile's calibration file (other factors kept); returns its path."""
    path = calibration_path(profile)
    existing = (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}
    calibrated = {**(existing.get("calibrated") or {}), **factors}
    header = (f"# Written by `dflashx calibrate` at {utc_now()} from runs: {', '.join(runs)}.\n"
              "# Merged into the profile's `calibrated` by the recipe loader; delete to go back to "
              "the profile's defaults.\n")
    atomic_write_text(path, header + yaml.safe_dump({"calibrated": calibrated}, sort_keys=True))
    return path
