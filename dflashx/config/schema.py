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
    hf_config: str | None = Field(None, description="`datasets` configuration name.")
    split: str = Field("train", description="`datasets` split.")
    format: Literal["auto", "messages", "sharegpt", "alpaca", "function_calling", "prompt"] = Field(
        "auto", description="Record layout; `auto` recognises it from the fields."
    )
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
    prompt_bytes_mean: float = Field(
        1200.0, gt=0, description="Bytes of one prompt record on disk (storage estimates)."
    )
    output_bytes_per_token: float = Field(
        4.0, gt=0, description="Bytes of completion text per generated token (storage estimates)."
    )


class DatasetSpec(Strict):
    sources: list[SourceSpec] = Field(min_length=1, description="Prompt sources, read in this order.")
    dedupe: bool = Field(True, description="Drop prompts seen before (same content, across all sources).")
    shuffle_seed: int = Field(
        0, description="Seed of the prompt order (and so of caps and the eval holdout)."
    )
    eval_holdout: int = Field(0, ge=0, description="Prompts held out of training for evaluation.")
    stats: DatasetStats = Field(
        default_factory=DatasetStats, description="Planning figures used before the data exists."
    )


# --------------------------------------------------------------------------- target


class ChatTemplateSpec(Strict):
    enable_thinking: bool = Field(
        True, description="Chat-template flag for thinking targets; keep it on to train on reasoning."
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra chat-template kwargs.")


class TargetSpec(Strict):
    model: str = Field(description="HF id, local folder, or `builtin:tiny-qwen3` / `builtin:tiny-qwen3_5`.")
    arch: str | None = Field(None, description="Registry key when `model` is not a known id.")
    tokenizer: str | None = Field(None, description="Tokenizer path/id when it differs from `model`.")
    precision: Precision = Field("bf16", description="Precision the target is loaded in.")
    chat_template: ChatTemplateSpec = Field(
        default_factory=ChatTemplateSpec, description="Chat-template options."
    )
    mtp: bool = Field(False, description="Serve with the target's MTP head (NEXTN speculative decoding).")


# --------------------------------------------------------------------------- drafter


class DrafterSpec(Strict):
    """DFlash block-diffusion drafter (arXiv 2602.06036)."""

    num_layers: int = Field(5, ge=1, description="Transformer layers of the drafter.")
    block_size: int = Field(16, description="Anchor + (B-1) mask tokens; must be >= 2.")
    num_target_layers: int = Field(5, ge=1, description="k target layers fused by `fc`.")
    target_layer_ids: list[int] | None = Field(
        None, description="Explicit target layer ids; default spreads k over the target."
    )
    mask_token_id: int | None = Field(None, description="Unused embedding row; default from the target.")
    layer_types: list[Literal["full_attention", "sliding_attention"]] | None = Field(
        None, description="Attention type per drafter layer; default: all full attention."
    )
    sliding_window: int | None = Field(
        None, ge=1, description="Window of `sliding_attention` layers, tokens."
    )
    intermediate_size: int | None = Field(None, ge=1, description="Default: the target's FFN size.")
    init_from: str | None = Field(None, description="Folder of a DFlash checkpoint to continue training.")


# --------------------------------------------------------------------------- hardware


class GpuSpec(Strict):
    name: str = Field(description="GPU model, e.g. `H200`.")
    memory_gb: float = Field(gt=0, description="Per-GPU memory, GB (1e9 bytes).")
    bandwidth_tbs: float = Field(gt=0, description="Per-GPU memory bandwidth, TB/s.")
    bf16_tflops: float = Field(gt=0, description="Dense BF16 TFLOP/s (not the sparse headline).")
    fp8_tflops: float | None = Field(None, gt=0, description="Dense FP8 TFLOP/s; null = no FP8.")


class ServingDefaults(Strict):
    tp: int = Field(1, ge=1, description="Tensor-parallel GPUs per server (--tp-size).")
    dp: int = Field(1, ge=1, description="Data-parallel replicas.")
    dp_mode: Literal["router", "dp_size"] = Field(
        "dp_size", description="dp > 1: one server per replica behind sglang_router, or one server with --dp-size."
    )
    weight_dtype: Precision = Field(
        "bf16", description="Serving weight precision (`fp8` adds --quantization fp8)."
    )
    kv_cache_dtype: Literal["auto", "bf16", "fp8_e4m3", "fp8_e5m2"] = Field(
        "auto", description="SGLang --kv-cache-dtype."
    )
    mem_fraction_static: float = Field(0.85, gt=0, le=1, description="SGLang --mem-fraction-static.")
    max_running_requests: int = Field(
        256, ge=1, description="Sequences decoded at once per server (--max-running-requests)."
    )
    efficiency: float = Field(0.5, gt=0, le=1, description="Achieved / roofline decode throughput.")


class TrainingDefaults(Strict):
    zero_stage: Literal[0, 1, 2, 3] = Field(
        2, description="DeepSpeed ZeRO stage when stages.train.zero_stage is unset."
    )
    micro_batch: int = Field(
        1, ge=1, description="Sequences per GPU per step when stages.train.micro_batch is unset."
    )
    mfu: float = Field(0.35, gt=0, le=1, description="Expected model-FLOPs utilisation.")


class HardwareProfile(Strict):
    name: str = Field(description="Profile name; a profile file's name is its file name without .yaml.")
    description: str = Field("", description="Free text about the node.")
    gpu: GpuSpec | None = Field(None, description="null for the CPU profile.")
    gpus_per_node: int = Field(0, ge=0, description="GPUs per node (0 for the CPU profile).")
    nodes: int = Field(1, ge=1, description="Nodes used together.")
    interconnect: str = Field("none", description="GPU interconnect, e.g. `NVLink 5` or `PCIe 5`.")
    usd_per_gpu_hour: float = Field(0.0, ge=0, description="Rental price per GPU-hour, for cost estimates.")
    cpu_tflops: float = Field(0.2, gt=0, description="Used when `gpu` is null.")
    cpu_bandwidth_tbs: float = Field(0.02, gt=0, description="Host memory bandwidth, TB/s; used when `gpu` is null.")
    serving: ServingDefaults = Field(
        default_factory=ServingDefaults, description="SGLang serving defaults for this node."
    )
    training: TrainingDefaults = Field(
        default_factory=TrainingDefaults, description="DeepSpeed training defaults for this node."
    )
    calibrated: dict[str, float] = Field(
        default_factory=dict, description="Efficiency factors fitted by `dflashx calibrate`."
    )

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.nodes


# --------------------------------------------------------------------------- stages


class StageBase(Strict):
    enabled: bool = Field(True, description="Run this stage; false skips it.")


class IngestStage(StageBase):
    shard_size: int = Field(50_000, ge=1, description="Prompts per output JSONL shard.")


class GenerateStage(StageBase):
    backend: Literal["sglang", "transformers"] = Field(
        "sglang",
        description="`sglang` servers (GPU nodes) or local `transformers` generation (CPU, small targets).",
    )
    urls: list[str] = Field(default_factory=list, description="Attach to running servers instead of starting them.")
    max_tokens: int = Field(8192, ge=1, description="Most generated tokens per prompt (reasoning + answer).")
    temperature: float = Field(0.6, ge=0, description="Sampling temperature.")
    top_p: float = Field(0.95, gt=0, le=1, description="Nucleus-sampling threshold.")
    concurrency: int = Field(256, ge=1, description="In-flight requests per server.")
    request_timeout_s: float = Field(
        1800, gt=0, description="Seconds before one request is given up and retried."
    )
    retries: int = Field(
        5, ge=0, description="Retries of a failed request before it is recorded with an error."
    )
    retry_backoff_s: float = Field(
        1.0, gt=0, description="First retry delay; doubles per attempt (capped at 60 s), with jitter."
    )
    batch_size: int = Field(8, ge=1, description="transformers backend: prompts per generate() call.")
    flush_every: int = Field(64, ge=1, description="Records per fsync'ed batch.")
    shard_size: int = Field(50_000, ge=1, description="Completions per output JSONL shard.")
    hierarchical_cache: bool = Field(
        True, description="Start SGLang with --enable-hierarchical-cache (KV cache spills to host memory)."
    )
    context_length: int | None = Field(
        None, ge=1, description="SGLang --context-length; default: the target's own."
    )
    server_startup_timeout_s: float = Field(
        1800, gt=0, description="Seconds to wait for started servers to report healthy."
    )


class QCThresholds(Strict):
    max_empty_reasoning_frac: float = Field(
        0.02, ge=0, le=1, description="Most completions allowed with empty reasoning when thinking is on."
    )
    min_answer_words: int = Field(2, ge=0, description="Answers with fewer words count as short.")
    max_short_answer_frac: float = Field(0.10, ge=0, le=1, description="Most answers allowed to be short.")
    max_repeated_answer_frac: float = Field(
        0.05, ge=0, le=1, description="Most answers allowed to share one identical short reply."
    )
    max_truncated_frac: float = Field(
        0.05, ge=0, le=1, description="Most completions allowed to stop at max_tokens (finish_reason=length)."
    )
    max_unbalanced_think_frac: float = Field(
        0.02, ge=0, le=1, description="Most completions allowed with missing or unclosed think markers."
    )
    max_duplicate_response_frac: float = Field(
        0.02, ge=0, le=1, description="Most responses allowed to repeat an earlier one word for word."
    )
    max_mask_spike_frac: float = Field(0.20, ge=0, le=1, description="Share of samples at one small loss-mask size.")
    mask_spike_max_tokens: int = Field(32, ge=1, description="'Small' loss-mask size for the spike test.")


class QCStage(StageBase):
    thresholds: QCThresholds = Field(
        default_factory=QCThresholds, description="Limits of the QC gate; a breached limit fails the stage."
    )
    mask_sample: int = Field(
        50_000, ge=0,
        description="Samples (an even spread) whose loss-mask sizes are measured with the target tokenizer; 0 = all.",
    )


class TokenizeStage(StageBase):
    max_length: int = Field(3072, ge=8, description="Tokens per sample (prompt + completion).")
    overflow: Literal["truncate", "drop"] = Field("truncate", description="What happens to longer samples.")
    min_loss_tokens_blocks: float = Field(2.0, ge=0, description="Drop samples with < this x block_size loss tokens.")
    num_proc: int = Field(2, ge=1, description="Worker processes for `datasets.map`.")
    shard_size: int = Field(10_000, ge=1, description="Samples per Arrow shard.")


class TrainStage(StageBase):
    mode: Literal["online", "offline"] = Field(
        "online",
        description="`online` recomputes the target's hidden states each step; `offline` stores them first (large).",
    )
    epochs: float = Field(6, gt=0, description="Passes over the training set.")
    max_steps: int | None = Field(
        None, ge=1, description="Stop after this many optimizer steps (before the epochs end)."
    )
    lr: float = Field(6e-4, gt=0, description="Peak learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="Optimizer weight decay.")
    warmup_ratio: float = Field(
        0.04, ge=0, lt=1, description="Share of the steps spent warming the learning rate up."
    )
    grad_clip: float = Field(1.0, gt=0, description="Gradient-norm clipping.")
    global_batch: int = Field(64, ge=1, description="Sequences per optimizer step across all GPUs.")
    micro_batch: int | None = Field(None, ge=1, description="Default: the hardware profile's.")
    zero_stage: Literal[0, 1, 2] | None = Field(None, description="Default: the hardware profile's.")
    anchors_per_seq: int = Field(512, ge=1, description="Anchor positions (blocks) sampled per sequence.")
    loss_gamma: float | None = Field(None, gt=0, description="Slot decay; default 7/5/4 for B=16/10/8.")
    max_length: int | None = Field(None, ge=8, description="Default: tokenize.max_length.")
    checkpoint_every: int = Field(500, ge=1, description="Optimizer steps between checkpoints.")
    log_every: int = Field(10, ge=1, description="Optimizer steps between logged metrics.")
    seed: int = Field(0, description="Random seed.")


class EvalStage(StageBase):
    num_prompts: int = Field(64, ge=1, description="Held-out prompts evaluated.")
    max_new_tokens: int = Field(
        256, ge=1, description="Tokens generated per prompt while measuring acceptance."
    )
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (0 = greedy).")
    prompts: str | None = Field(None, description="JSONL of held-out prompts; default: dataset.eval_holdout.")


class ExportStage(StageBase):
    dtype: Precision = Field("bf16", description="Weight dtype of the exported drafter.")


class BackupStage(StageBase):
    include_replaceable: bool = Field(
        True, description="Also copy replaceable artifacts, not only irreplaceable ones."
    )


class Stages(Strict):
    ingest: IngestStage = Field(
        default_factory=IngestStage, description="Read, normalise, dedupe and shard the prompts."
    )
    generate: GenerateStage = Field(
        default_factory=GenerateStage, description="Target completions (SGLang or transformers)."
    )
    qc: QCStage = Field(default_factory=QCStage, description="Quality gate on the completions.")
    tokenize: TokenizeStage = Field(
        default_factory=TokenizeStage, description="Chat template and loss masks into an Arrow dataset."
    )
    train: TrainStage = Field(default_factory=TrainStage, description="DFlash drafter training (DeepSpeed).")
    eval: EvalStage = Field(
        default_factory=EvalStage, description="Acceptance evaluation of the trained drafter."
    )
    export: ExportStage = Field(
        default_factory=ExportStage, description="The drafter as config.json + model.safetensors."
    )
    backup: BackupStage = Field(
        default_factory=BackupStage, description="Copy the run's artifacts to S3 and verify them."
    )


STAGE_ORDER: tuple[str, ...] = tuple(Stages.model_fields)


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

    bucket: str = Field(description="Bucket name.")
    prefix: str = Field("", description="Key prefix for runs, e.g. `runs/`.")
    endpoint_url: str | None = Field(None, description="S3-compatible endpoint; default: AWS.")
    region: str | None = Field(None, description="Region; default: from the environment or AWS profile.")
    path_style: bool = Field(False, description="Path-style addressing (many S3-compatible stores need it).")
    aws_profile: str | None = Field(None, description="Named profile in ~/.aws (optional).")
    part_size: ByteSize = Field(
        64 * 2**20, ge=5 * 2**20,
        description="Multipart upload part size (resumable); files smaller than this go in one PUT.",
    )
    max_concurrency: int = Field(8, ge=1, le=64, description="Parts of one file uploaded at the same time.")


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
    max_usd: float | None = Field(
        None, ge=0, description="GPU spending limit in USD; plans above it are errors."
    )
    max_days: float | None = Field(
        None, gt=0, description="Wall-clock limit in days; plans above it are errors."
    )


# --------------------------------------------------------------------------- recipe


class Recipe(Strict):
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Run name: names the run directory under storage.root.",
    )
    description: str = Field("", description="Free text about the project.")
    dataset: DatasetSpec = Field(description="Prompt sources and planning figures.")
    target: TargetSpec = Field(description="The target model the drafter learns to draft for.")
    drafter: DrafterSpec = Field(
        default_factory=DrafterSpec, description="The DFlash drafter's architecture."
    )
    hardware: HardwareProfile = Field(
        description="A profile name (hardware_profiles/NAME.yaml) or an inline profile."
    )
    stages: Stages = Field(default_factory=Stages, description="Each stage's parameters and on/off switch.")
    tracking: TrackingSpec = Field(default_factory=TrackingSpec, description="Weights & Biases settings.")
    storage: StorageSpec = Field(
        default_factory=StorageSpec, description="Where run directories and backups live."
    )
    budget: BudgetSpec = Field(default_factory=BudgetSpec, description="Limits the plan is checked against.")


def recipe_json_schema() -> dict[str, Any]:
    """JSON Schema of a recipe file (as written: `hardware` may also be a profile name)."""
    schema = Recipe.model_json_schema()
    hw = schema["properties"]["hardware"]
    schema["properties"]["hardware"] = {"anyOf": [{"type": "string", "description": "Profile name"}, hw]}
    schema["properties"]["extends"] = {"type": "string", "description": "Base recipe path"}
    return schema
