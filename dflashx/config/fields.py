"""Building blocks of the recipe schema: the strict base model and shared field types."""

# No `from __future__ import annotations` here: pydantic would evaluate every field's string
# annotation when the class is created, which `dflashx plan`'s start-up pays (benchmarks/cli_latency.py).

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.config import JsonDict
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
}


def parse_size(value: Any) -> Any:
    """Accept byte counts as integers or strings such as "20TB", "1.5 TiB", "512GiB"."""
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if not m or m.group(2).lower() not in _SIZE_UNITS:
            raise ValueError(f"not a size: {value!r} (use bytes or e.g. '20TB', '512GiB')")
        return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
    return value


ByteSize = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]
# Every float of a recipe: `.inf`, `1e309` (which YAML reads as infinity) and `.nan` are errors.
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Precision = Literal["bf16", "fp16", "fp32", "fp8"]


KEY_PROBLEM = "key_problem"


def key_problem(key: str, message: str, fix: str) -> PydanticCustomError:
    """A section's validator's error about one of its keys, written or missing: `config.errors` reports it
    at that key (its file and line, or the override that set it) with `fix` as the hint."""
    return PydanticCustomError(KEY_PROBLEM, message, {"key": key, "fix": fix})


class Strict(BaseModel):
    """Base for every recipe section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, defer_build=True)

# One table per precision fact: bytes per element, and the torch dtype name it computes in (FP8
# weights compute in bf16). Planner estimates and the torch-side loaders read these, nothing else.
PRECISION_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
TORCH_DTYPE: dict[str, str] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "bfloat16"}

# --------------------------------------------------------------------------- stage-key roles
# Every field a stage key can reach says what it is to that key, as a marker on the field itself
# (`json_schema_extra`): OUTPUT changes the stage's output (hashed), OPERATIONAL does not (how fast,
# where, how often: left out), PATH is a local path hashed by the content it points to.
STAGE_KEY = "stage_key"
OUTPUT: JsonDict = {STAGE_KEY: "output"}
OPERATIONAL: JsonDict = {STAGE_KEY: "operational"}
PATH: JsonDict = {STAGE_KEY: "path"}

# --------------------------------------------------------------------------- calibration groups
# A second marker on the same fields: which groups of pilot-measured figures (`dflashx.plan.calibration`:
# data, serving, training, tau) a field's value conditions. `calibrates("serving", "training")` puts the
# whole value in those groups (a sub-model's every field, flattened to dotted keys); BY_FIELD walks a
# sub-model (or each model of a list) and lets its own fields' markers say; UNCALIBRATED conditions
# none. Merged into the stage-key marker where a field has one: `OUTPUT | calibrates("data")`.
CALIBRATES = "calibrates"
CALIBRATION_GROUPS = ("data", "serving", "training", "tau")
BY_FIELD: JsonDict = {CALIBRATES: "fields"}
UNCALIBRATED: JsonDict = {CALIBRATES: []}


def calibrates(*groups: Literal["data", "serving", "training", "tau"]) -> JsonDict:
    """The marker of a field whose value conditions these calibration groups."""
    return {CALIBRATES: list(groups)}


def marker(info: FieldInfo, kind: str) -> Any:
    """The value a field's `kind` marker (STAGE_KEY or CALIBRATES) holds, or None when it has none."""
    extra = info.json_schema_extra
    return extra.get(kind) if isinstance(extra, dict) else None


def fields_of(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """A section's fields, with the extra ones it declares as fields (the drafter's architecture keys:
    `DrafterSpec.extra_fields`), so that stage keys, calibration and the docs read them and their markers."""
    declared = getattr(model, "extra_fields", None)
    return dict(model.model_fields) | (declared() if declared else {})


class StageBase(Strict):
    """What every stage has: its on/off switch."""

    enabled: bool = Field(True, description="Run this stage; false skips it.",
                          json_schema_extra=OPERATIONAL | UNCALIBRATED)
