"""Recipe schema: the `stages` section (one model per stage, with its knobs and defaults)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dflashx.config.fields import Precision, Strict


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
