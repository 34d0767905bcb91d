"""The recipe schema: the single source of truth for every key a recipe may hold.

`Recipe` and its top-level sections are here; the larger sections live beside it (`stages.py`,
`eval_stage.py`, `hardware.py`, `speculative.py`, `drafter.py`) and are re-exported. Every model
forbids unknown keys (`extra="forbid"`), so a misspelled key is an error, never a silently ignored
setting. Defaults live on the fields and nowhere else (a hardware profile's facts are data, in
`dflashx/hardware_profiles/*.yaml`); derived values (target layer ids, loss decay gamma, micro batch,
DeepSpeed config, ...) are filled in once by `dflashx.resolve.resolve` into the `ResolvedRecipe`, except
`stages.train.tau_every`, which needs the train-time estimate: the planner decides it once
(`dflashx.plan.estimates.training` with `dflashx.resolve.tau.tau_every`) and the plan holds it
(`Plan.stage("train").tau_every`); the resolved recipe keeps the recipe's value.
This module imports no torch, deepspeed or transformers.
"""

# No `from __future__ import annotations` here: pydantic would evaluate every field's string
# annotation when the class is created, which `dflashx plan`'s start-up pays (benchmarks/cli_latency.py).

from typing import Any, Literal

from pydantic import Field, model_validator

from dflashx.config.fields import (
    BY_FIELD,
    OPERATIONAL,
    OUTPUT,
    PATH,
    UNCALIBRATED,
    ByteSize,
    FiniteFloat,
    Precision,
    Strict,
    calibrates,
    parse_size,
)
from dflashx.config.eval_stage import EvalBaseline, EvalSuite
from dflashx.config.eval_suites import BUILTIN_BASELINES, BUILTIN_SUITES
from dflashx.config.drafter import DrafterSpec
from dflashx.config.hardware import GpuSpec, HardwareProfile
from dflashx.config.speculative import DeploySpec, SpeculativeSpec
from dflashx.config.stages import (  # the stage models are part of the schema
    STAGE_ORDER, StageBase, IngestStage, GenerateStage, ServingSpec, QCThresholds, QCStage, TokenizeStage, TrainStage,
    EvalStage, ExportStage, BackupStage, Stages,
)

__all__ = [
    "STAGE_ORDER",
    "BackupStage",
    "BudgetSpec",
    "ByteSize",
    "ChatTemplateSpec",
    "DatasetSpec",
    "DatasetStats",
    "DeploySpec",
    "DrafterSpec",
    "EvalBaseline",
    "EvalStage",
    "EvalSuite",
    "ExportStage",
    "GenerateStage",
    "GpuSpec",
    "HardwareProfile",
    "IngestStage",
    "OutputHistogram",
    "PilotSpec",
    "Precision",
    "QCStage",
    "QCThresholds",
    "Recipe",
    "S3Spec",
    "ServingSpec",
    "SourceSpec",
    "SpeculativeSpec",
    "StageBase",
    "Stages",
    "StorageSpec",
    "Strict",
    "TargetSpec",
    "Tier",
    "TokenizeStage",
    "TrackingSpec",
    "TrainStage",
    "parse_size",
    "recipe_json_schema",
]

# --------------------------------------------------------------------------- dataset


class SourceSpec(Strict):
    """One prompt source: a local JSONL/Parquet file or a `datasets` hub id."""

    name: str = Field(description="Short name used in records and per-source counts.",
                      json_schema_extra=OUTPUT | calibrates("data"))
    path: str | None = Field(None, description="Local .jsonl/.json/.parquet file or folder.",
                             json_schema_extra=PATH | calibrates("data"))
    hf_id: str | None = Field(None, description="`datasets` id (needs network).",
                              json_schema_extra=OUTPUT | calibrates("data"))
    hf_config: str | None = Field(None, description="`datasets` configuration name.",
                                  json_schema_extra=OUTPUT | calibrates("data"))
    split: str = Field("train", description="`datasets` split.", json_schema_extra=OUTPUT | calibrates("data"))
    format: Literal["auto", "messages", "sharegpt", "alpaca", "function_calling", "prompt"] = Field(
        "auto", description="Record layout; `auto` recognises it from the fields.",
        json_schema_extra=OUTPUT | calibrates("data")
    )
    fields: dict[str, str] = Field(
        default_factory=dict,
        description="Field mapping for this source, e.g. {prompt: question, system: system_prompt}.",
        json_schema_extra=OUTPUT | calibrates("data")
    )
    system_prompt: str | None = Field(None, description="System prompt added when a sample has none.",
                                      json_schema_extra=OUTPUT | calibrates("data"))
    cap: int | None = Field(None, ge=1, description="Keep at most this many prompts (after shuffle).",
                            json_schema_extra=OUTPUT | calibrates("data"))
    expected_count: int | None = Field(
        None, ge=0, description="Raw prompt count, for planning before the data is on disk.",
        json_schema_extra=OPERATIONAL | UNCALIBRATED
    )

    @model_validator(mode="after")
    def _one_location(self) -> "SourceSpec":
        if (self.path is None) == (self.hf_id is None):
            raise ValueError("give exactly one of `path` (local file) or `hf_id` (datasets id)")
        return self


class OutputHistogram(Strict):
    """Output lengths as bins: `counts[i]` completions between `edges[i]` and `edges[i+1]` tokens
    (spread evenly inside a bin), and `above` completions longer than the last edge (cut there:
    how much longer is unknown)."""

    edges: list[FiniteFloat] = Field(min_length=2, description="Bin edges in tokens, increasing, from >= 0.")
    counts: list[FiniteFloat] = Field(description="Completions (or shares) per bin; one fewer than edges.")
    above: FiniteFloat = Field(0.0, ge=0, description="Completions longer than the last edge (e.g. cut at max_tokens).")

    @model_validator(mode="after")
    def _bins(self) -> "OutputHistogram":
        if len(self.counts) != len(self.edges) - 1:
            raise ValueError(f"counts has {len(self.counts)} entries for {len(self.edges)} edges: give one count per "
                             "bin (edges - 1)")
        if self.edges[0] < 0 or any(b < a for a, b in zip(self.edges, self.edges[1:])):
            raise ValueError("edges must start at 0 or more and never decrease")
        if any(c < 0 for c in self.counts) or sum(self.counts) + self.above <= 0:
            raise ValueError("counts must be non-negative and hold at least one completion")
        return self


class DatasetStats(Strict):
    """Planning figures for data not generated yet; measured values replace them after a run."""

    samples: int | None = Field(None, ge=0,
                                description="Samples after filtering, dedupe and the eval holdout: the prompts the "
                                            "ingest writes for generation (what a pilot measures); default: the "
                                            "sources' counts less dataset.eval_holdout.")
    prompt_tokens_mean: FiniteFloat = Field(250.0, gt=0, description="Template + system + user tokens.")
    output_tokens_mean: FiniteFloat = Field(1800.0, gt=0, description="Generated tokens (reasoning+answer).")
    output_tokens_p90: FiniteFloat | None = Field(
        None, gt=0, description="90th percentile of generated tokens; with the mean it fixes the length "
        "distribution (log-normal) behind truncation estimates. Default: a spread of CV 1.",
    )
    output_tokens_histogram: OutputHistogram | None = Field(
        None, description="Measured output lengths as a histogram; when given it is the length distribution "
        "(the mean and p90 above are then not used). `dflashx pilot` measures one.",
    )
    output_tokens_mean_se: FiniteFloat | None = Field(
        None, ge=0, description="Standard error of the mean output length (sd / sqrt(n) of the completions it was "
        "measured on; 0 when measured on the whole dataset). Null: the mean is a person's estimate, and the "
        "plan's P10-P90 range assumes it is within a factor 1.5 of the truth.",
    )
    generated: int = Field(0, ge=0, description="Completions the run already holds (a pilot's, kept for the full "
                           "generation, which resumes after them): the generate stage's time is planned for the "
                           "rest. `dflashx pilot` writes it.")
    prompt_bytes_mean: FiniteFloat = Field(
        1200.0, gt=0, description="Bytes of one prompt record on disk (storage estimates)."
    )
    output_bytes_per_token: FiniteFloat = Field(
        4.0, gt=0, description="Bytes of completion text per generated token (storage estimates)."
    )


class DatasetSpec(Strict):
    sources: list[SourceSpec] = Field(min_length=1, description="Prompt sources, read in this order.",
                                      json_schema_extra=OUTPUT | BY_FIELD)
    dedupe: bool = Field(True, description="Drop prompts seen before (same content, across all sources).",
                         json_schema_extra=OUTPUT | calibrates("data"))
    shuffle_seed: int = Field(
        0, description="Seed of the prompt order (and so of caps and the eval holdout).",
        json_schema_extra=OUTPUT | UNCALIBRATED
    )
    eval_holdout: int = Field(0, ge=0, description="Prompts held out of training for evaluation.",
                              json_schema_extra=OUTPUT | calibrates("data"))
    stats: DatasetStats = Field(
        default_factory=DatasetStats, description="Planning figures used before the data exists.",
        json_schema_extra=OPERATIONAL | UNCALIBRATED
    )


# --------------------------------------------------------------------------- target


class ChatTemplateSpec(Strict):
    enable_thinking: bool = Field(
        True, description="Chat-template flag for thinking targets; keep it on to train on reasoning.",
        json_schema_extra=OUTPUT
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra chat-template kwargs.",
                                   json_schema_extra=OUTPUT)


class TargetSpec(Strict):
    model: str = Field(description="HF id, local folder, or `builtin:tiny-qwen3` / `builtin:tiny-qwen3_5` / "
                                   "`builtin:tiny-qwen3_moe`.",
                                   json_schema_extra=PATH | calibrates("data", "serving", "training"))
    arch: str | None = Field(None, description="Registry key when `model` is not a known id.",
                             json_schema_extra=OPERATIONAL | UNCALIBRATED)
    tokenizer: str | None = Field(None, description="Tokenizer path/id when it differs from `model`.",
                                  json_schema_extra=PATH | calibrates("data", "serving", "training"))
    precision: Precision = Field(
        "bf16", description="Precision the target is loaded in; `fp8`: training and evaluation run its "
        "decoder layers' linears in FP8 (per-token / per-channel scales), the rest in bf16.",
        json_schema_extra=OUTPUT | calibrates("data", "serving", "training")
    )
    chat_template: ChatTemplateSpec = Field(
        default_factory=ChatTemplateSpec, description="Chat-template options.",
        json_schema_extra=OUTPUT | calibrates("data", "serving", "training")
    )
    mtp: bool = Field(
        False, description="Generate with the target's MTP head (SGLang speculative decoding, settings in "
        "stages.generate.serving.speculative); the plan says whether it pays at the planned batch.",
        json_schema_extra=OPERATIONAL | UNCALIBRATED)


# --------------------------------------------------------------------------- tracking, storage, budget


class TrackingSpec(Strict):
    project: str = Field("dflashx", description="W&B project.")
    entity: str | None = Field(None, description="W&B entity (team or user); default: the logged-in user's.")
    mode: Literal["offline", "online", "disabled"] = Field(
        "offline",
        description="`offline` writes W&B runs locally to sync later, `online` streams, `disabled` turns W&B off.",
    )


class S3Spec(Strict):
    """Where backups go. Credentials never live here: they come from the environment or a profile."""

    bucket: str = Field(description="Bucket name.", json_schema_extra=OUTPUT)
    prefix: str = Field("", description="Key prefix for runs, e.g. `runs/`.", json_schema_extra=OUTPUT)
    endpoint_url: str | None = Field(None, description="S3-compatible endpoint; default: AWS.",
                                     json_schema_extra=OUTPUT)
    region: str | None = Field(None, description="Region; default: from the environment or AWS profile.",
                               json_schema_extra=OUTPUT)
    path_style: bool = Field(False, description="Path-style addressing (many S3-compatible stores need it).",
                             json_schema_extra=OPERATIONAL)
    aws_profile: str | None = Field(None, description="Named profile in ~/.aws (optional).",
                                    json_schema_extra=OPERATIONAL)
    part_size: ByteSize = Field(
        64 * 2**20, ge=5 * 2**20,
        description="Multipart upload part size (resumable); files smaller than this go in one PUT.",
        json_schema_extra=OPERATIONAL
    )
    max_concurrency: int = Field(8, ge=1, le=64, description="Parts of one file uploaded at the same time.",
                                 json_schema_extra=OPERATIONAL)


Tier = Literal["irreplaceable", "replaceable", "garbage"]


class StorageSpec(Strict):
    root: str = Field("runs", description="Local folder that holds run directories.")
    s3: S3Spec | None = Field(None, description="S3 (or compatible) destination of backups; null = none.")
    tiers: dict[str, Tier] = Field(
        default_factory=dict, description="Tier overrides by artifact name, e.g. {generate.completions: irreplaceable}."
    )


class BudgetSpec(Strict):
    max_storage_bytes: ByteSize | None = Field(
        None, description="Disk the run may use in all (bytes or e.g. 20TB); plans above it are errors."
    )
    max_usd: FiniteFloat | None = Field(
        None, ge=0, description="GPU spending limit in USD; plans above it are errors."
    )
    max_days: FiniteFloat | None = Field(
        None, gt=0, description="Wall-clock limit in days; plans above it are errors."
    )


class PilotSpec(Strict):
    """`dflashx pilot`: a small real run that measures what the plan assumed, before the big spend."""

    enabled: Literal["auto"] | bool = Field(
        "auto", description="Run the pilot first in `dflashx run`: `auto` on a GPU profile (not on the CPU profile), "
        "or true/false. `--skip-pilot` turns it off for one run.",
    )
    prompts: int = Field(512, ge=1, description="Prompts the pilot generates (kept: the full generation reuses them).")
    max_minutes: FiniteFloat | None = Field(
        30.0, gt=0, description="Stop sending new pilot prompts after this many minutes of generation (those "
        "in flight finish); null: no limit.",
    )
    train_steps: int = Field(200, ge=1, description="Optimizer steps the pilot trains, to measure MFU and tokens/s.")
    roundtrip: bool = Field(
        True, description="First, the export round-trip gate: overfit the recipe's drafter on two replies of the "
        "target, export it as the export stage does, load it back and decode with the target; the pilot stops, "
        "naming the check, when τ stays under 0.8 x the block size (docs/running.md#the-export-round-trip-gate).",
    )


# --------------------------------------------------------------------------- recipe


class Recipe(Strict):
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Run name: names the run directory under storage.root.", json_schema_extra=UNCALIBRATED
    )
    description: str = Field("", description="Free text about the project.", json_schema_extra=UNCALIBRATED)
    dataset: DatasetSpec = Field(description="Prompt sources and planning figures.", json_schema_extra=BY_FIELD)
    target: TargetSpec = Field(description="The target model the drafter learns to draft for.",
                               json_schema_extra=BY_FIELD)
    drafter: DrafterSpec = Field(
        default_factory=DrafterSpec, description="The DFlash drafter's architecture.",
        json_schema_extra=calibrates("training")
    )
    hardware: HardwareProfile = Field(
        description="A profile name (hardware_profiles/NAME.yaml) or an inline profile.", json_schema_extra=BY_FIELD
    )
    stages: Stages = Field(default_factory=Stages, description="Each stage's parameters and on/off switch.",
                           json_schema_extra=BY_FIELD)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec, description="Weights & Biases settings.",
                                   json_schema_extra=UNCALIBRATED)
    storage: StorageSpec = Field(
        default_factory=StorageSpec, description="Where run directories and backups live.",
        json_schema_extra=UNCALIBRATED
    )
    budget: BudgetSpec = Field(default_factory=BudgetSpec, description="Limits the plan is checked against.",
                               json_schema_extra=UNCALIBRATED)
    pilot: PilotSpec = Field(default_factory=PilotSpec, description="The calibrating pilot run (`dflashx pilot`).",
                             json_schema_extra=UNCALIBRATED)
    deploy: DeploySpec = Field(
        default_factory=DeploySpec, description="Where the trained drafter will be served: concurrencies and expected "
        "tau of the predicted speed-up.", json_schema_extra=UNCALIBRATED)
    acknowledge: list[str] = Field(
        default_factory=list,
        description="Blocking plan findings accepted on purpose, by code (e.g. [thinking_off]); reviewed in PRs.",
        json_schema_extra=UNCALIBRATED
    )


def recipe_json_schema() -> dict[str, Any]:
    """JSON Schema of a recipe file (as written: `hardware` may also be a profile name)."""
    schema = Recipe.model_json_schema()
    hw = schema["properties"]["hardware"]
    schema["properties"]["hardware"] = {"anyOf": [{"type": "string", "description": "Profile name"}, hw]}
    schema["properties"]["extends"] = {"type": "string", "description": "Base recipe path"}
    for key, builtins in (("suites", BUILTIN_SUITES), ("baselines", BUILTIN_BASELINES)):  # bare names too
        field = schema["$defs"]["EvalStage"]["properties"][key]
        field["items"] = {"anyOf": [{"type": "string", "enum": list(builtins), "description": "Built-in name"},
                                    field["items"]]}
    return schema
