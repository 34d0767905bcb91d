"""The recipe schema: the single source of truth for every key a recipe may hold.

Every model forbids unknown keys (`extra="forbid"`), so a misspelled key is an error, never a
silently ignored setting. Defaults live here and nowhere else; the planner fills in derived values
(target layer ids, loss decay gamma, micro batch from the profile) in `Plan.resolved`.
This module imports no torch, deepspeed or transformers.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

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
Precision = Literal["bf16", "fp16", "fp32", "fp8"]


class Strict(BaseModel):
    """Base for every recipe section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# --------------------------------------------------------------------------- dataset


class SourceSpec(Strict):
    """One prompt source: a local JSONL/Parquet file or a `datasets` hub id."""

    name: str = Field(description="Short name used in records and per-source counts.")
    path: str | None = Field(None, description="Local .jsonl/.json/.parquet file or folder.")
    hf_id: str | None = Field(None, description="`datasets` id (needs network).")
    hf_config: str | None = None
    split: str = "train"
    format: Literal["auto", "messages", "sharegpt", "alpaca", "function_calling", "prompt"] = "auto"
    fields: dict[str, str] = Field(
        default_factory=dict,
        description="Field mapping for this source, e.g. {prompt: question, system: system_prompt}.",
    )
    system_prompt: str | None = Field(None, description="System prompt added when a sample has none.")
    cap: int | None = Field(None, ge=1, description="Keep at most this many prompts (after shuffle).")
    expected_count: int | None = Field(
        None, ge=0, description="Raw prompt count, for planning before the data is on disk."
    )

    @model_validator(mode="after")
    def _one_location(self) -> "SourceSpec":
        if (self.path is None) == (self.hf_id is None):
            raise ValueError("give exactly one of `path` (local file) or `hf_id` (datasets id)")
        return self


class DatasetStats(Strict):
    """Planning figures for data not generated yet; measured values replace them after a run."""

    samples: int | None = Field(None, ge=0, description="Samples after filtering and dedupe.")
    prompt_tokens_mean: float = Field(250.0, gt=0, description="Template + system + user tokens.")
    output_tokens_mean: float = Field(1800.0, gt=0, description="Generated tokens (reasoning+answer).")
    prompt_bytes_mean: float = Field(1200.0, gt=0)
    output_bytes_per_token: float = Field(4.0, gt=0)


class DatasetSpec(Strict):
    sources: list[SourceSpec] = Field(min_length=1)
    dedupe: bool = True
    shuffle_seed: int = 0
    eval_holdout: int = Field(0, ge=0, description="Prompts held out of training for evaluation.")
    stats: DatasetStats = Field(default_factory=DatasetStats)


# --------------------------------------------------------------------------- target


class ChatTemplateSpec(Strict):
    enable_thinking: bool = True
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra chat-template kwargs.")


class TargetSpec(Strict):
    model: str = Field(description="HF id, local folder, or `builtin:tiny-qwen3` / `builtin:tiny-qwen3_5`.")
    arch: str | None = Field(None, description="Registry key when `model` is not a known id.")
    tokenizer: str | None = Field(None, description="Tokenizer path/id when it differs from `model`.")
    precision: Precision = "bf16"
    chat_template: ChatTemplateSpec = Field(default_factory=ChatTemplateSpec)
    mtp: bool = Field(False, description="Serve with the target's MTP head (NEXTN speculative decoding).")


# --------------------------------------------------------------------------- drafter


class DrafterSpec(Strict):
    """DFlash block-diffusion drafter (arXiv 2602.06036)."""

    num_layers: int = Field(5, ge=1)
    block_size: int = Field(16, description="Anchor + (B-1) mask tokens; must be >= 2.")
    num_target_layers: int = Field(5, ge=1, description="k target layers fused by `fc`.")
    target_layer_ids: list[int] | None = Field(
        None, description="Explicit target layer ids; default spreads k over the target."
    )
    mask_token_id: int | None = Field(None, description="Unused embedding row; default from the target.")
    layer_types: list[Literal["full_attention", "sliding_attention"]] | None = None
    sliding_window: int | None = Field(None, ge=1)
    intermediate_size: int | None = Field(None, ge=1, description="Default: the target's FFN size.")
    init_from: str | None = Field(None, description="Folder of a DFlash checkpoint to continue training.")


# --------------------------------------------------------------------------- hardware


class GpuSpec(Strict):
    name: str
    memory_gb: float = Field(gt=0, description="Per-GPU memory, GB (1e9 bytes).")
    bandwidth_tbs: float = Field(gt=0, description="Per-GPU memory bandwidth, TB/s.")
    bf16_tflops: float = Field(gt=0, description="Dense BF16 TFLOP/s (not the sparse headline).")
    fp8_tflops: float | None = Field(None, gt=0, description="Dense FP8 TFLOP/s; null = no FP8.")


class ServingDefaults(Strict):
    tp: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    weight_dtype: Precision = "bf16"
    kv_cache_dtype: Literal["auto", "bf16", "fp8_e4m3", "fp8_e5m2"] = "auto"
    mem_fraction_static: float = Field(0.85, gt=0, le=1)
    max_running_requests: int = Field(256, ge=1)
    efficiency: float = Field(0.5, gt=0, le=1, description="Achieved / roofline decode throughput.")


class TrainingDefaults(Strict):
    zero_stage: Literal[0, 1, 2, 3] = 2
    micro_batch: int = Field(1, ge=1)
    mfu: float = Field(0.35, gt=0, le=1, description="Expected model-FLOPs utilisation.")


class HardwareProfile(Strict):
    name: str
    description: str = ""
    gpu: GpuSpec | None = Field(None, description="null for the CPU profile.")
    gpus_per_node: int = Field(0, ge=0)
    nodes: int = Field(1, ge=1)
    interconnect: str = "none"
    usd_per_gpu_hour: float = Field(0.0, ge=0)
    cpu_tflops: float = Field(0.2, gt=0, description="Used when `gpu` is null.")
    serving: ServingDefaults = Field(default_factory=ServingDefaults)
    training: TrainingDefaults = Field(default_factory=TrainingDefaults)
    calibrated: dict[str, float] = Field(
        default_factory=dict, description="Efficiency factors fitted by `dflashx calibrate`."
    )

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.nodes


# --------------------------------------------------------------------------- stages


class StageBase(Strict):
    enabled: bool = True


class IngestStage(StageBase):
    shard_size: int = Field(50_000, ge=1, description="Prompts per output JSONL shard.")


class GenerateStage(StageBase):
    backend: Literal["sglang", "transformers"] = "sglang"
    urls: list[str] = Field(default_factory=list, description="Attach to running servers instead of starting them.")
    max_tokens: int = Field(8192, ge=1)
    temperature: float = Field(0.6, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    concurrency: int = Field(256, ge=1, description="In-flight requests per server.")
    request_timeout_s: float = Field(1800, gt=0)
    retries: int = Field(5, ge=0)
    batch_size: int = Field(8, ge=1, description="transformers backend: prompts per generate() call.")
    flush_every: int = Field(64, ge=1, description="Records per fsync'ed batch.")
    hierarchical_cache: bool = True
    context_length: int | None = Field(None, ge=1)
    server_startup_timeout_s: float = Field(1800, gt=0)


class QCThresholds(Strict):
    max_empty_reasoning_frac: float = Field(0.02, ge=0, le=1)
    min_answer_words: int = Field(2, ge=0)
    max_short_answer_frac: float = Field(0.10, ge=0, le=1)
    max_repeated_answer_frac: float = Field(0.05, ge=0, le=1)
    max_truncated_frac: float = Field(0.05, ge=0, le=1)
    max_unbalanced_think_frac: float = Field(0.02, ge=0, le=1)
    max_duplicate_response_frac: float = Field(0.02, ge=0, le=1)
    max_mask_spike_frac: float = Field(0.20, ge=0, le=1, description="Share of samples at one small loss-mask size.")
    mask_spike_max_tokens: int = Field(32, ge=1, description="'Small' loss-mask size for the spike test.")


class QCStage(StageBase):
    thresholds: QCThresholds = Field(default_factory=QCThresholds)


class TokenizeStage(StageBase):
    max_length: int = Field(3072, ge=8)
    overflow: Literal["truncate", "drop"] = "truncate"
    min_loss_tokens_blocks: float = Field(2.0, ge=0, description="Drop samples with < this x block_size loss tokens.")
    num_proc: int = Field(2, ge=1)
    shard_size: int = Field(10_000, ge=1)


class TrainStage(StageBase):
    mode: Literal["online", "offline"] = "online"
    epochs: float = Field(6, gt=0)
    max_steps: int | None = Field(None, ge=1)
    lr: float = Field(6e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_ratio: float = Field(0.04, ge=0, lt=1)
    grad_clip: float = Field(1.0, gt=0)
    global_batch: int = Field(64, ge=1, description="Sequences per optimizer step across all GPUs.")
    micro_batch: int | None = Field(None, ge=1, description="Default: the hardware profile's.")
    zero_stage: Literal[0, 1, 2] | None = Field(None, description="Default: the hardware profile's.")
    anchors_per_seq: int = Field(512, ge=1)
    loss_gamma: float | None = Field(None, gt=0, description="Slot decay; default 7/5/4 for B=16/10/8.")
    max_length: int | None = Field(None, ge=8, description="Default: tokenize.max_length.")
    checkpoint_every: int = Field(500, ge=1)
    log_every: int = Field(10, ge=1)
    seed: int = 0


class EvalStage(StageBase):
    num_prompts: int = Field(64, ge=1)
    max_new_tokens: int = Field(256, ge=1)
    temperature: float = Field(0.0, ge=0)
    prompts: str | None = Field(None, description="JSONL of held-out prompts; default: dataset.eval_holdout.")


class ExportStage(StageBase):
    dtype: Precision = "bf16"


class BackupStage(StageBase):
    include_replaceable: bool = True


class Stages(Strict):
    ingest: IngestStage = Field(default_factory=IngestStage)
    generate: GenerateStage = Field(default_factory=GenerateStage)
    qc: QCStage = Field(default_factory=QCStage)
    tokenize: TokenizeStage = Field(default_factory=TokenizeStage)
    train: TrainStage = Field(default_factory=TrainStage)
    eval: EvalStage = Field(default_factory=EvalStage)
    export: ExportStage = Field(default_factory=ExportStage)
    backup: BackupStage = Field(default_factory=BackupStage)


STAGE_ORDER: tuple[str, ...] = tuple(Stages.model_fields)


# --------------------------------------------------------------------------- tracking, storage, budget


class TrackingSpec(Strict):
    project: str = "dflashx"
    entity: str | None = None
    mode: Literal["offline", "online", "disabled"] = "offline"


class S3Spec(Strict):
    """Where backups go. Credentials never live here: they come from the environment or a profile."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    path_style: bool = False
    aws_profile: str | None = Field(None, description="Named profile in ~/.aws (optional).")


Tier = Literal["irreplaceable", "replaceable", "garbage"]


class StorageSpec(Strict):
    root: str = Field("runs", description="Local folder that holds run directories.")
    s3: S3Spec | None = None
    tiers: dict[str, Tier] = Field(
        default_factory=dict, description="Tier overrides by artifact name, e.g. {generate.completions: irreplaceable}."
    )


class BudgetSpec(Strict):
    max_storage_bytes: ByteSize | None = None
    max_usd: float | None = Field(None, ge=0)
    max_days: float | None = Field(None, gt=0)


# --------------------------------------------------------------------------- recipe


class Recipe(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    dataset: DatasetSpec
    target: TargetSpec
    drafter: DrafterSpec = Field(default_factory=DrafterSpec)
    hardware: HardwareProfile
    stages: Stages = Field(default_factory=Stages)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    storage: StorageSpec = Field(default_factory=StorageSpec)
    budget: BudgetSpec = Field(default_factory=BudgetSpec)


def recipe_json_schema() -> dict[str, Any]:
    """JSON Schema of a recipe file (as written: `hardware` may also be a profile name)."""
    schema = Recipe.model_json_schema()
    hw = schema["properties"]["hardware"]
    schema["properties"]["hardware"] = {"anyOf": [{"type": "string", "description": "Profile name"}, hw]}
    schema["properties"]["extends"] = {"type": "string", "description": "Base recipe path"}
    return schema
