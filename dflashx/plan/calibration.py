"""Measured figures a pilot run hands the planner, each applied only where it was measured.

`dflashx pilot` writes a `PilotCalibration` to `<run_dir>/pilot/calibration.json`; the CLI (the
composition root) reads it and passes it to `make_plan(..., calibration=)`, which stays pure. Each
figure carries the recipe values it was measured under (`conditions`, four groups); a group whose
values differ from the recipe being planned is not applied, and the plan says which key changed:

  data      samples (the ingest's count), prompt and output lengths (a histogram of the measured
            completions, the standard error of their mean): the prompt sources, the target and its
            chat template, the generation's sampling settings and max_tokens;
  serving   `hardware.calibrated[CALIBRATED_SERVING]`, measured tokens/s over the planner's own
            prediction for the pilot's conditions, and with the target's MTP head on the accepted length
            the servers reported (`stages.generate.serving.speculative.acceptance` becomes the geometric
            profile with that tau): the node, the target, the generation settings;
  training  `hardware.calibrated[CALIBRATED_MFU]`, the MFU the trainer measured (gradient sync
            included), `[CALIBRATED_TAU_PROBE]`, the seconds one held-out τ measurement took (its
            batched decode is launch-bound on a GPU, which no roofline prices), and
            `[CALIBRATED_DECODE_CYCLE]`, the seconds of one batched draft-verify cycle in it (what the eval
            stage's batched decodes cost per cycle): the node, the target, the drafter, the batch and lengths
            of training;
  tau       the pilot's held-out τ curve (`tau_curve`): what decides how the drafter learns and what is
            decoded, i.e. the data and training groups' values, the optimisation and objective (the
            `calibrates("tau")` fields: lr, optimizer, labels, loss, ...) and the held-out slice
            (`dflashx.resolve.tau.tau_slice`: `stages.train.tau_prompts`, `tau_max_new_tokens`).

The τ curve is a measurement, not a figure that replaces a recipe value: under the tau group's conditions
it is handed on in the report (`CalibrationReport.tau_curve`), which `make_plan` passes to the rules
(`train_too_short`); under other values it is listed as not applied. A calibration.json without it (written
before the pilot measured τ) has none.
"""

# No `from __future__ import annotations` here: pydantic would evaluate every field's string
# annotation when the class is created, which `dflashx plan`'s start-up pays (benchmarks/cli_latency.py).

from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

from dflashx.config.fields import BY_FIELD, CALIBRATES, CALIBRATION_GROUPS, marker
from dflashx.config.schema import DatasetStats, Recipe
from dflashx.config.tree import flatten
from dflashx.resolve.tau import TauPoint, tau_slice
from dflashx.plan.context import PlanContext, build_context
from dflashx.plan.estimates.device import (
    CALIBRATED_DECODE_CYCLE, CALIBRATED_INGEST, CALIBRATED_KEYS, CALIBRATED_MFU, CALIBRATED_SERVING,
    CALIBRATED_TAU_PROBE,
)
from dflashx.resolve import resolve
from dflashx.resolve.speculative import geometric_profile
from dflashx.targets.registry import TargetFacts

CALIBRATION_VERSION = 1


class PilotCalibration(BaseModel):
    """What `dflashx pilot` measured, with where and under which recipe values (JSON on disk)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = CALIBRATION_VERSION
    run_id: str = Field(description="The run whose pilot measured it.")
    run_dir: str
    measured_at: str
    conditions: dict[str, dict[str, Any]] = Field(description="group -> {dotted recipe key: value} at measurement.")
    stats: dict[str, Any] = Field(description="Measured `dataset.stats` fields (samples, lengths, histogram, "
                                  "standard error of the mean, bytes).")
    serving_ratio: float | None = Field(None, gt=0, description="Measured / predicted generation tokens/s.")
    serving_ratio_rse: float | None = Field(None, ge=0, description="Relative standard error of the ratio.")
    mtp_accept_length: float | None = Field(None, ge=1, description="Tokens per draft-verify cycle the SGLang "
                                            "servers reported while the pilot generated with the MTP head.")
    training_mfu: float | None = Field(None, gt=0, le=1, description="MFU the trainer measured.")
    training_mfu_rse: float | None = Field(None, ge=0, description="Relative standard error of the MFU.")
    tau_probe_seconds: float | None = Field(None, gt=0, description="Seconds one held-out τ measurement took in "
                                            "the pilot's training (the median of its measurements).")
    decode_cycle_seconds: float | None = Field(None, gt=0, description="Seconds of one batched draft-verify cycle "
                                               "in the pilot's held-out τ measurements (the median of theirs).")
    ingest_seconds: float | None = Field(None, gt=0, description="Seconds the run's own ingest stage took in the "
                                         "pilot (the run skips it: its key is unchanged); None: the pilot did not "
                                         "run it.")
    tau_curve: list[TauPoint] = Field(default_factory=list, description="Held-out τ the pilot's training measured, "
                                      "by optimizer step (the last at its last step); empty: none measured.")
    measured: dict[str, Any] = Field(default_factory=dict, description="The pilot's raw figures, for reports.")


def _is_list(node: Any) -> bool:
    return isinstance(node, list)  # a list (dataset.sources) is one condition, as calibration.json keeps it


@dataclass(frozen=True)
class NotApplied:
    """A group of figures measured under other recipe values: its figures and the keys that changed."""

    group: str
    figures: tuple[str, ...]
    changed: tuple[str, ...]


@dataclass(frozen=True)
class CalibrationReport:
    """What a plan took from a pilot (plan.json's `calibration`): the figures `applied` (dotted recipe key ->
    value), those `not_applied`, the run and when, the relative standard errors of the applied groups, and the
    pilot's held-out τ curve when the tau group applies (a measurement for reports and rules)."""

    run_id: str
    run_dir: str
    measured_at: str
    applied: dict[str, Any] = field(default_factory=dict)
    not_applied: tuple[NotApplied, ...] = ()
    rse: dict[str, float] = field(default_factory=dict)
    tau_curve: tuple[TauPoint, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"not_applied": [asdict(n) | {"figures": list(n.figures), "changed": list(n.changed)}
                                               for n in self.not_applied],
                               "tau_curve": [p.model_dump() for p in self.tau_curve]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CalibrationReport":
        return cls(str(data["run_id"]), str(data["run_dir"]), str(data["measured_at"]), dict(data["applied"]),
                   tuple(NotApplied(str(n["group"]), tuple(n["figures"]), tuple(n["changed"]))
                         for n in data["not_applied"]),
                   {str(g): float(v) for g, v in data["rse"].items()},
                   tuple(TauPoint.model_validate(p) for p in data.get("tau_curve", ())))


def calibration_marker(info: FieldInfo) -> list[str] | str | None:
    """A field's calibration marker: the groups its value conditions, BY_FIELD's "fields", or None (no marker)."""
    return marker(info, CALIBRATES)


def _walk(model: BaseModel, dumped: dict[str, Any], group: str) -> dict[str, Any]:
    """The fields of `model` (with `dumped`, its JSON dump) whose markers put them in `group`, nested as dumped;
    a BY_FIELD field's sub-model, or each model of its list, is walked the same way."""
    kept: dict[str, Any] = {}
    for name, info in type(model).model_fields.items():
        marker, value = calibration_marker(info), getattr(model, name)
        if marker == BY_FIELD[CALIBRATES]:
            if isinstance(value, list):
                items = [_walk(item, d, group) for item, d in zip(value, dumped[name], strict=True)]
                if any(items):
                    kept[name] = items
            elif isinstance(value, BaseModel) and (sub := _walk(value, dumped[name], group)):
                kept[name] = sub
        elif isinstance(marker, list) and group in marker:
            kept[name] = dumped[name]
    return kept


TAU_ALSO = ("data", "training")  # groups whose values decide the τ curve too (module doc)


def conditions(recipe: Recipe) -> dict[str, dict[str, Any]]:
    """The recipe values each group of figures depends on, flattened to dotted keys (JSON values): the fields
    whose `calibrates` markers (`dflashx.config.fields`) name the group; the tau group adds the TAU_ALSO groups'
    values and the held-out slice a measurement decodes (`tau_slice`)."""
    data = recipe.model_dump(mode="json")
    groups = {group: {k: v for section, value in _walk(recipe, data, group).items()
                      for k, v in flatten(value, section, _is_list).items()}
              for group in CALIBRATION_GROUPS}
    prompts, new_tokens = tau_slice(recipe)
    groups["tau"] = {**{k: v for g in TAU_ALSO for k, v in groups[g].items()}, **groups["tau"],
                     "stages.train.tau_prompts": prompts, "stages.train.tau_max_new_tokens": new_tokens}
    return groups


def changed(then: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ between two flattened condition groups."""
    return [k for k in dict.fromkeys([*now, *then]) if then.get(k) != now.get(k)]


def _shown(key: str, value: Any) -> Any:
    """A figure as the plan's JSON lists it (a histogram by its size)."""
    if key == "output_tokens_histogram":
        return f"{len(value['counts'])} bins, {sum(value['counts']) + value.get('above', 0):.0f} completions"
    return value


MTP_KEY = "stages.generate.serving.speculative.acceptance"
TAU_CURVE = "pilot held-out τ curve"  # how a not-applied group lists the curve (no recipe key)


def mtp_profile(recipe: Recipe, tau: float | None) -> list[float] | None:
    """The geometric acceptance profile over the recipe's MTP steps with a measured tau."""
    return None if tau is None else geometric_profile(tau, recipe.stages.generate.serving.speculative.num_steps)


def with_mtp_accept_length(recipe: Recipe, tau: float) -> Recipe:
    """The recipe whose MTP acceptance profile is the geometric one with a measured tau."""
    gen = recipe.stages.generate
    spec = gen.serving.speculative.model_copy(update={"acceptance": mtp_profile(recipe, tau)})
    serving = gen.serving.model_copy(update={"speculative": spec})
    return recipe.model_copy(update={"stages": recipe.stages.model_copy(update={
        "generate": gen.model_copy(update={"serving": serving})})})


def apply_calibration(recipe: Recipe, cal: PilotCalibration) -> tuple[Recipe, CalibrationReport]:
    """The recipe with the pilot's figures in place, and what was (not) applied, for the plan's JSON."""
    now = conditions(recipe)
    stats, calibrated = recipe.dataset.stats, dict(recipe.hardware.calibrated)
    figures = {
        "data": {**{f"dataset.stats.{k}": _shown(k, v) for k, v in cal.stats.items()},
                 f"hardware.calibrated.{CALIBRATED_INGEST}": cal.ingest_seconds},
        "serving": {f"hardware.calibrated.{CALIBRATED_SERVING}": cal.serving_ratio,
                    MTP_KEY: mtp_profile(recipe, cal.mtp_accept_length)},
        "training": {f"hardware.calibrated.{CALIBRATED_MFU}": cal.training_mfu,
                     f"hardware.calibrated.{CALIBRATED_TAU_PROBE}": cal.tau_probe_seconds,
                     f"hardware.calibrated.{CALIBRATED_DECODE_CYCLE}": cal.decode_cycle_seconds},
        "tau": {TAU_CURVE: cal.tau_curve or None},
    }
    applied: dict[str, Any] = {}
    not_applied: list[NotApplied] = []
    for group, values in figures.items():
        values = {k: v for k, v in values.items() if v is not None}
        diff = changed(cal.conditions.get(group, {}), now[group]) if values else []
        if diff:
            not_applied.append(NotApplied(group, tuple(sorted(values)), tuple(diff)))
            continue
        if group == "tau":
            continue  # a measurement, not a recipe value: handed on in the report
        applied |= values
        if group == "data" and values:
            stats = DatasetStats.model_validate({**stats.model_dump(), **cal.stats})
            if cal.ingest_seconds is not None:
                calibrated[CALIBRATED_INGEST] = float(cal.ingest_seconds)
        elif group == "serving" and values:
            if cal.serving_ratio is not None:
                calibrated[CALIBRATED_SERVING] = float(cal.serving_ratio)
            if cal.mtp_accept_length is not None:
                recipe = with_mtp_accept_length(recipe, cal.mtp_accept_length)
        elif group == "training":
            calibrated |= {key: float(value) for key, value in ((CALIBRATED_MFU, cal.training_mfu),
                                                                (CALIBRATED_TAU_PROBE, cal.tau_probe_seconds),
                                                                (CALIBRATED_DECODE_CYCLE, cal.decode_cycle_seconds))
                           if value is not None}
    updated = recipe.model_copy(update={
        "dataset": recipe.dataset.model_copy(update={"stats": stats}),
        "hardware": recipe.hardware.model_copy(update={"calibrated": calibrated}),
    })
    rse = {"serving": cal.serving_ratio_rse, "training": cal.training_mfu_rse}
    skipped = {n.group for n in not_applied}
    return updated, CalibrationReport(cal.run_id, cal.run_dir, cal.measured_at, applied, tuple(not_applied),
                                      {g: v for g, v in rse.items() if v is not None and g not in skipped},
                                      () if "tau" in skipped else tuple(cal.tau_curve))


def uncalibrated(recipe: Recipe, stats: dict[str, Any], **sections: dict[str, Any]) -> Recipe:
    """The recipe with measured `dataset.stats` fields, without the measured factors (serving ratio,
    MFU), and with these stage settings (`generate={...}`, `train={...}`): what the planner's own
    models predict for the conditions a measurement was taken under."""
    hardware = recipe.hardware.model_copy(update={"calibrated": {
        k: v for k, v in recipe.hardware.calibrated.items()
        if k not in CALIBRATED_KEYS}})
    measured = DatasetStats.model_validate({**recipe.dataset.stats.model_dump(), **stats})
    stages = recipe.stages.model_copy(update={name: getattr(recipe.stages, name).model_copy(update=values)
                                              for name, values in sections.items()})
    return recipe.model_copy(update={"hardware": hardware, "stages": stages,
                                     "dataset": recipe.dataset.model_copy(update={"stats": measured})})


def predicted(recipe: Recipe, facts: TargetFacts, stats: dict[str, Any], **sections: dict[str, Any]) -> PlanContext:
    """The plan context of `uncalibrated(...)`: the models' figures for a measurement's conditions."""
    return build_context(resolve(uncalibrated(recipe, stats, **sections), facts))


def predicted_tokens_per_s(ctx: PlanContext) -> float:
    """Generated tokens per second of the whole generation (prefill included, the stage's fixed costs not: the
    generate stage's meter starts after the backend is up), as measured runs count them."""
    seconds = ctx.generation.seconds
    return ctx.tokens.output / seconds if seconds else 0.0
