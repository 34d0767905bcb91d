"""`dflashx calibrate`: the planner's measured factors per hardware profile, from finished runs and pilots.

- `serving_ratio` (`CALIBRATED_SERVING`) = measured generation tokens/s over what the planner's own
  serving model predicts for the same conditions: the run's recipe with the lengths it measured and
  without any serving calibration (`plan.calibration.predicted`), so the ratio is right whether or
  not the run itself was planned with one.
- `training_mfu` = the MFU the trainer measured (achieved model FLOP/s over the profile's peak, the
  definition the planner's training estimate divides by).
A run's finished generate/train stages are fitted from their metrics; a run whose pilot measured
(`pilot/calibration.json`) adds the pilot's figures, fitted the same way by `dflashx pilot`.
Several fits of one profile are combined by their median; values are clipped to (0, 1] for the MFU.
`--write` stores them as `hardware_profiles/<profile>.calibration.yaml` ({calibrated: {...}}),
which `load_recipe` merges into `HardwareProfile.calibrated` for every recipe on that profile;
`dflashx plan` then marks those factors as calibrated.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dflashx.config.load import CALIBRATION_SUFFIX, available_profiles
from dflashx.config.schema import Recipe
from dflashx.plan.calibration import PilotCalibration, predicted, predicted_tokens_per_s
from dflashx.plan.estimates.device import CALIBRATED_MFU, CALIBRATED_SERVING
from dflashx.plan.estimates.lengths import scaled_stats
from dflashx.report.fmt import Section, human_value
from dflashx.report.runinfo import RunInfo
from dflashx.run.layout import calibration_path as pilot_file
from dflashx.store.manifest import atomic_write_text, utc_now

FactsFor = Callable[[Recipe], Any]  # recipe -> TargetFacts | None (the CLI's target_facts)


@dataclass
class Fit:
    run: str
    profile: str
    factor: str
    planned: float  # the model's figure (tokens/s, or MFU)
    measured: float
    fitted: float


@dataclass
class Calibration:
    fits: list[Fit] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def factors(self) -> dict[str, dict[str, float]]:
        """{profile: {factor: median of the fits}} (an MFU clipped to 1)."""
        grouped: dict[str, dict[str, list[float]]] = {}
        for f in self.fits:
            grouped.setdefault(f.profile, {}).setdefault(f.factor, []).append(f.fitted)
        return {p: {k: round(min(statistics.median(v), 1.0) if k == CALIBRATED_MFU else statistics.median(v), 4)
                    for k, v in fs.items()} for p, fs in grouped.items()}

    def sections(self) -> list[Section]:
        fits = Section("Fits per run", ["run", "profile", "factor", "model", "measured", "fitted"],
                       [[f.run, f.profile, f.factor, human_value(f.planned), human_value(f.measured),
                         human_value(f.fitted)] for f in self.fits],
                       "; ".join(self.notes))
        factors = Section("Calibrated factors (median per profile)", ["profile", "factor", "value"],
                          [[p, k, human_value(v)] for p, fs in self.factors.items() for k, v in fs.items()])
        return [fits, factors]


def _serving_fit(run: RunInfo, recipe: Recipe, facts: Any) -> Fit | None:
    """The finished generation's tokens/s over the model's, at the lengths it measured."""
    m = run.metrics("generate")
    tps, mean, written = m.get("output_tokens_per_s"), m.get("output_tokens_mean"), m.get("completions_written")
    if not (tps and mean and written) or facts is None:
        return None
    stats = recipe.dataset.stats
    measured = scaled_stats(stats, mean / stats.output_tokens_mean).model_dump()
    measured |= {"samples": int(written), "prompt_tokens_mean": m.get("prompt_tokens_mean") or stats.prompt_tokens_mean}
    model = predicted_tokens_per_s(predicted(recipe, facts, measured))
    return Fit(run.name, recipe.hardware.name, CALIBRATED_SERVING, model, float(tps),
               float(tps) / model) if model else None


def _pilot_fits(run: RunInfo, profile: str) -> list[Fit]:
    path = pilot_file(run.path)
    if not path.is_file():
        return []
    cal = PilotCalibration.model_validate_json(path.read_bytes())
    gen, train = cal.measured.get("generation") or {}, cal.measured.get("training") or {}
    fits = []
    if cal.serving_ratio:
        fits.append(Fit(f"{run.name} (pilot)", profile, CALIBRATED_SERVING, gen["predicted_tokens_per_s"],
                        gen["measured_tokens_per_s"], cal.serving_ratio))
    if cal.training_mfu:
        fits.append(Fit(f"{run.name} (pilot)", profile, CALIBRATED_MFU, train["mfu_planned"], train["mfu"],
                        cal.training_mfu))
    return fits


def fit_run(run: RunInfo, facts_for: FactsFor, into: Calibration) -> None:
    """Add the run's fits (or a note saying why there are none) to `into`."""
    recipe = run.recipe
    profile, facts = recipe.hardware.name, facts_for(recipe)
    fits = _pilot_fits(run, profile)
    serving = _serving_fit(run, recipe, facts)
    if serving:
        fits.append(serving)
    mfu = run.metrics("train").get("mfu")
    if mfu and facts is not None:
        model = next(t for t in predicted(recipe, facts, {}).training.terms if t.key == "train.seconds").inputs["mfu"]
        fits.append(Fit(run.name, profile, CALIBRATED_MFU, model, float(mfu), float(mfu)))
    into.fits += fits
    factors = {f.factor for f in fits}
    into.notes += [f"{run.name}: no measured {what}" for key, what in
                   ((CALIBRATED_SERVING, "generation throughput"),
                    (CALIBRATED_MFU, "training MFU")) if key not in factors]


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
