"""Recipe schema: the `stages` section (one model per stage, with its knobs and defaults)."""

# No `from __future__ import annotations` here: pydantic would evaluate every field's string
# annotation when the class is created, which `dflashx plan`'s start-up pays (benchmarks/cli_latency.py).

from typing import Final, Literal

from pydantic import Field

from dflashx.config.eval_stage import EvalStage
from dflashx.config.fields import (
    BY_FIELD,
    OPERATIONAL,
    OUTPUT,
    UNCALIBRATED,
    FiniteFloat,
    StageBase,
    Strict,
    calibrates,
)
from dflashx.config.speculative import SpeculativeSpec

AUTO: Final = "auto"


# --------------------------------------------------------------------------- stages


class IngestStage(StageBase):
    shard_size: int = Field(50_000, ge=1, description="Prompts per output JSONL shard (how the prompts are cut into "
                            "files, not what they are: a change applies when the ingest next runs and re-runs "
                            "nothing by itself).", json_schema_extra=OPERATIONAL)


class ServingSpec(Strict):
    """How SGLang serves the target: engine settings, not hardware facts. `auto` values are derived
    once in `dflashx.resolve` (docs/planner.md, "Derived values")."""

    tp: int | Literal["auto"] = Field(
        AUTO, description="Tensor-parallel GPUs per server (--tp-size); auto: the smallest that holds the weights "
        "and one full-length sequence.", json_schema_extra=OPERATIONAL)
    dp: int | Literal["auto"] = Field(
        AUTO, description="Data-parallel replicas; auto: the profile's GPUs / tp.", json_schema_extra=OPERATIONAL)
    dp_mode: Literal["auto", "router", "dp_size"] = Field(
        AUTO, description="dp > 1: one server per replica (behind sglang_router) or one server with --dp-size; "
        "auto: router without NVLink-class links (interconnect_gbs < 100), else dp_size.",
        json_schema_extra=OPERATIONAL)
    weight_dtype: Literal["auto", "bf16", "fp16", "fp32", "fp8"] = Field(
        AUTO, description="Weights the servers run; auto: target.precision. FP8 serving changes the completions "
        "(the training data).", json_schema_extra=OUTPUT)
    checkpoint: str | None = Field(
        None, description="Checkpoint the servers load, e.g. an official FP8 one (Qwen/Qwen3.6-27B-FP8); default "
        "target.model, which `fp8` then quantizes online (--quantization fp8).", json_schema_extra=OUTPUT)
    kv_cache_dtype: Literal["auto", "bf16", "fp8_e4m3", "fp8_e5m2"] = Field(
        AUTO, description="SGLang --kv-cache-dtype (auto: the weights' compute dtype).", json_schema_extra=OUTPUT)
    mem_fraction_static: FiniteFloat = Field(
        0.85, gt=0, le=1, description="SGLang --mem-fraction-static.", json_schema_extra=OPERATIONAL)
    max_running_requests: int = Field(
        256, ge=1, description="Most sequences one replica decodes at once (--max-running-requests); the engine "
        "lowers it further when its KV or linear-attention state pool is full.", json_schema_extra=OPERATIONAL)
    speculative: SpeculativeSpec = Field(
        default_factory=SpeculativeSpec, description="SGLang's draft settings for the target's MTP head "
        "(`target.mtp: true`).", json_schema_extra=OPERATIONAL)
    drafter: str | None = Field(
        None, description="A DFlash drafter folder the servers draft with while generating (an earlier run's "
        "export/drafter for this target, trained with this recipe's drafter.block_size): vLLM "
        "--speculative-config {method: dflash}, SGLang --speculative-algorithm DFLASH. Speculative decoding keeps "
        "the target's output distribution, so the completions' law does not change; the plan prices generation "
        "with it (acceptance: speculative.acceptance, else the expected drafter acceptance, deploy) and the "
        "preflight checks the folder against the target. Not with target.mtp.",
        json_schema_extra=OPERATIONAL)


class GenerateStage(StageBase):
    backend: Literal["sglang", "vllm", "transformers"] = Field(
        "sglang",
        description="`sglang` servers (GPU nodes), `vllm` servers (GPU nodes, or vLLM's CPU build) or local "
        "`transformers` generation (CPU, small targets).",
        json_schema_extra=OUTPUT | calibrates("data", "serving")
    )
    server_python: str | None = Field(
        None, description="The Python interpreter the launched servers run with (`-m sglang.launch_server`, "
        "`-m vllm.entrypoints.openai.api_server`). SGLang and vLLM's GPU build pin their own CUDA torch, so on a "
        "GPU node point this at their environment's python; default: the interpreter running dflashx (its venv, "
        "where vLLM's CPU build installs: README).", json_schema_extra=OPERATIONAL | UNCALIBRATED)
    server_restarts: int = Field(
        3, ge=0, description="Times a launched server that exits while generating is started again (its log "
        "kept, appended) before the stage stops; a rerun resumes after the completions written either way.",
        json_schema_extra=OPERATIONAL | UNCALIBRATED)
    urls: list[str] = Field(default_factory=list, description="Attach to running servers instead of starting them.",
                            json_schema_extra=OPERATIONAL | UNCALIBRATED)
    max_tokens: int = Field(8192, ge=1, description="Most generated tokens per prompt (reasoning + answer).",
                            json_schema_extra=OUTPUT | calibrates("data", "serving"))
    temperature: FiniteFloat = Field(0.6, ge=0, description="Sampling temperature.",
                                     json_schema_extra=OUTPUT | calibrates("data", "serving"))
    top_p: FiniteFloat = Field(0.95, gt=0, le=1, description="Nucleus-sampling threshold.",
                               json_schema_extra=OUTPUT | calibrates("data", "serving"))
    concurrency: int | None = Field(
        None, ge=1, description="In-flight requests per replica; default: the running batch the plan assumed "
        "(docs/planner.md), so the servers run what was planned.",
        json_schema_extra=OPERATIONAL | calibrates("serving"))
    request_timeout_s: FiniteFloat = Field(
        1800, gt=0, description="Seconds before one request is given up and retried.",
        json_schema_extra=OPERATIONAL | UNCALIBRATED
    )
    retries: int = Field(
        5, ge=0, description="Retries of a failed request before it is recorded with an error.",
        json_schema_extra=OPERATIONAL | UNCALIBRATED
    )
    retry_backoff_s: FiniteFloat = Field(
        1.0, gt=0, description="First retry delay; doubles per attempt (capped at 60 s), with jitter.",
        json_schema_extra=OPERATIONAL | UNCALIBRATED
    )
    batch_size: int = Field(8, ge=1, description="transformers backend: prompts per generate() call.",
                            json_schema_extra=OPERATIONAL | calibrates("serving"))
    flush_every: int = Field(64, ge=1, description="Records per fsync'ed batch.",
                             json_schema_extra=OPERATIONAL | UNCALIBRATED)
    shard_size: int = Field(50_000, ge=1, description="Completions per output JSONL shard.",
                            json_schema_extra=OPERATIONAL | UNCALIBRATED)
    max_prompts: int | None = Field(
        None, ge=1, description="Stop once the completions folder holds this many (`dflashx pilot` sets "
        "pilot.prompts): the stage ends unfinished, with no _SUCCESS, and the next attempt resumes after them; "
        "null: every prompt.", json_schema_extra=OPERATIONAL | UNCALIBRATED)
    max_minutes: FiniteFloat | None = Field(
        None, gt=0, description="Stop sending new prompts after this many minutes (those in flight finish; "
        "`dflashx pilot` sets pilot.max_minutes): the stage then ends unfinished, as with max_prompts; null: "
        "no limit.", json_schema_extra=OPERATIONAL | UNCALIBRATED)
    hierarchical_cache: bool = Field(
        True, description="Start SGLang with --enable-hierarchical-cache (KV cache spills to host memory).",
        json_schema_extra=OPERATIONAL | calibrates("serving")
    )
    context_length: int | None = Field(
        None, ge=1, description="SGLang --context-length; default: the target's own (a longer prompt + max_tokens "
        "is refused by the server with HTTP 400).", json_schema_extra=OUTPUT | calibrates("data", "serving")
    )
    serving: ServingSpec = Field(
        default_factory=ServingSpec, description="SGLang serving settings (parallelism, precision, memory).",
        json_schema_extra=OUTPUT | calibrates("serving"))
    server_startup_timeout_s: FiniteFloat = Field(
        1800, gt=0, description="Seconds to wait for started servers to report healthy.",
        json_schema_extra=OPERATIONAL | UNCALIBRATED
    )


class QCThresholds(Strict):
    max_empty_reasoning_frac: FiniteFloat = Field(
        0.02, ge=0, le=1, description="Most completions allowed with empty reasoning when thinking is on.",
        json_schema_extra=OUTPUT
    )
    min_answer_words: int = Field(2, ge=0, description="Answers with fewer words count as short.",
                                  json_schema_extra=OUTPUT)
    max_short_answer_frac: FiniteFloat = Field(0.10, ge=0, le=1, description="Most answers allowed to be short.",
                                               json_schema_extra=OUTPUT)
    max_repeated_answer_frac: FiniteFloat = Field(
        0.05, ge=0, le=1, description="Most answers allowed to share one identical short reply.",
        json_schema_extra=OUTPUT
    )
    max_truncated_frac: FiniteFloat = Field(
        0.05, ge=0, le=1, description="Most completions allowed to stop at max_tokens (finish_reason=length).",
        json_schema_extra=OUTPUT
    )
    max_unbalanced_think_frac: FiniteFloat = Field(
        0.02, ge=0, le=1, description="Most completions allowed with missing or unclosed think markers.",
        json_schema_extra=OUTPUT
    )
    max_duplicate_response_frac: FiniteFloat = Field(
        0.02, ge=0, le=1, description="Most responses allowed to repeat an earlier one word for word.",
        json_schema_extra=OUTPUT
    )
    max_rejected_frac: FiniteFloat = Field(
        0.01, ge=0, le=1, description="Most prompts allowed to be refused by the server (completion records with "
        "`error`, e.g. too long for --context-length); they are counted here and dropped by tokenize.",
        json_schema_extra=OUTPUT)
    max_mask_spike_frac: FiniteFloat = Field(0.20, ge=0, le=1,
                                             description="Share of samples at one small loss-mask size.",
                                             json_schema_extra=OUTPUT)
    mask_spike_max_tokens: int = Field(32, ge=1, description="'Small' loss-mask size for the spike test.",
                                       json_schema_extra=OUTPUT)


class QCStage(StageBase):
    thresholds: QCThresholds = Field(
        default_factory=QCThresholds, description="Limits of the QC gate; a breached limit fails the stage.",
        json_schema_extra=OUTPUT
    )
    mask_sample: int = Field(
        50_000, ge=0,
        description="Samples (an even spread) whose loss-mask sizes are measured with the target tokenizer; 0 = all.",
        json_schema_extra=OUTPUT
    )


class TokenizeStage(StageBase):
    max_length: int = Field(3072, ge=8, description="Tokens per sample (prompt + completion).",
                            json_schema_extra=OUTPUT | calibrates("training"))
    overflow: Literal["truncate", "drop"] = Field("truncate", description="What happens to longer samples.",
                                                  json_schema_extra=OUTPUT | UNCALIBRATED)
    min_loss_tokens_blocks: FiniteFloat = Field(2.0, ge=0,
                                                description="Drop samples with < this x block_size loss tokens.",
                                                json_schema_extra=OUTPUT | UNCALIBRATED)
    num_proc: int = Field(2, ge=1, description="Worker processes for `datasets.map`.",
                          json_schema_extra=OPERATIONAL | UNCALIBRATED)
    shard_size: int = Field(10_000, ge=1, description="Samples per Arrow shard.",
                            json_schema_extra=OUTPUT | UNCALIBRATED)


class TrainStage(StageBase):
    mode: Literal["online", "offline"] = Field(
        "online",
        description="`online` recomputes the target's hidden states each step; `offline` stores them first (large).",
        json_schema_extra=OUTPUT | calibrates("training")
    )
    epochs: FiniteFloat = Field(6, gt=0, description="Passes over the training set.",
                                json_schema_extra=OUTPUT | UNCALIBRATED)
    max_steps: int | None = Field(
        None, ge=1, description="Stop after this many optimizer steps (before the epochs end).",
        json_schema_extra=OUTPUT | UNCALIBRATED
    )
    lr: FiniteFloat = Field(6e-4, gt=0, description="Peak learning rate.", json_schema_extra=OUTPUT | calibrates("tau"))
    weight_decay: FiniteFloat = Field(0.0, ge=0, description="Optimizer weight decay.",
                                      json_schema_extra=OUTPUT | calibrates("tau"))
    warmup_ratio: FiniteFloat = Field(
        0.04, ge=0, lt=1, description="Share of the steps spent warming the learning rate up.",
        json_schema_extra=OUTPUT | calibrates("tau")
    )
    grad_clip: FiniteFloat = Field(1.0, gt=0, description="Gradient-norm clipping.",
                                   json_schema_extra=OUTPUT | calibrates("tau"))
    global_batch: int = Field(64, ge=1, description="Sequences per optimizer step across all GPUs.",
                              json_schema_extra=OUTPUT | calibrates("training"))
    micro_batch: int | None = Field(None, ge=1, description="Default: the hardware profile's.",
                                    json_schema_extra=OPERATIONAL | calibrates("training"))
    zero_stage: Literal[0, 1, 2] | None = Field(None, description="Default: the hardware profile's.",
                                                json_schema_extra=OPERATIONAL | calibrates("training"))
    shard_target: Literal["auto", "always", "never"] = Field(
        "auto",
        description="Shard the frozen online target over the node's GPUs (DeepSpeed ZeRO-3, the drafter stays "
                    "data-parallel): `auto` when the target does not fit one GPU beside the drafter; `always` / "
                    "`never` force or forbid it.",
        json_schema_extra=OPERATIONAL | UNCALIBRATED,
    )
    anchors_per_seq: int = Field(512, ge=1, description="Anchor positions (blocks) sampled per sequence.",
                                 json_schema_extra=OUTPUT | calibrates("training"))
    loss_gamma: FiniteFloat | None = Field(None, gt=0, description="Slot decay; default 7/5/4 for B=16/10/8.",
                                           json_schema_extra=OUTPUT | calibrates("tau"))
    max_length: int | None = Field(None, ge=8, description="Default: tokenize.max_length.",
                                   json_schema_extra=OUTPUT | calibrates("training"))
    checkpoint_every: int = Field(500, ge=1, description="Optimizer steps between checkpoints.",
                                  json_schema_extra=OPERATIONAL | UNCALIBRATED)
    keep_checkpoints: int | None = Field(
        2, ge=1,
        description="DeepSpeed training states kept under train/checkpoints/: the K newest plus the one with the best "
                    "logged loss (each holds the weights and optimizer state); null keeps all.",
        json_schema_extra=OPERATIONAL | UNCALIBRATED,
    )
    log_every: int = Field(10, ge=1, description="Optimizer steps between logged metrics.",
                           json_schema_extra=OPERATIONAL | UNCALIBRATED)
    tau_every: int | None = Field(
        None, ge=0,
        description="Optimizer steps between held-out acceptance-length measurements during training (rank 0 "
                    "decodes the first held-out prompts greedily with the drafter as it stands; the last step is "
                    "always measured, and the best-τ drafter is kept and exported when it beats the last); 0 turns "
                    "it off; default: derived by the planner so that the measurements cost at most 5% of the rest of "
                    "the train stage's estimated time (docs/training.md, \"Held-out τ while training\").",
        json_schema_extra=OPERATIONAL | UNCALIBRATED,
    )
    seed: int = Field(0, description="Random seed.", json_schema_extra=OUTPUT | UNCALIBRATED)
    compile: bool | Literal["auto"] = Field(
        "auto",
        description="torch.compile the drafter's layers (fuses norms, RoPE, SwiGLU and FP8 casts); `auto`: on a GPU, "
                    "when the steps left pay for a cold compile (measured on the first eager steps; never on a CPU). "
                    "Context lengths and block counts are padded to buckets so lengths do not recompile.",
        json_schema_extra=OPERATIONAL | UNCALIBRATED,
    )
    loss_kernel: Literal["auto", "liger", "torch"] = Field(
        "auto",
        description="Fused LM-head + cross-entropy of the supervised slots: `torch` (chunked, the gradient computed "
                    "in the forward pass) or `liger` (liger-kernel's Triton kernel, CUDA, when installed; else torch; "
                    "`decay_ce` only); `auto`: liger on GPUs for `decay_ce`, else torch. Logits never exist for all "
                    "tokens at once.",
        json_schema_extra=OPERATIONAL | UNCALIBRATED,
    )
    loss: Literal["decay_ce", "dpace"] = Field(
        "dpace",
        description="Training objective over a block's slots: `decay_ce`, cross-entropy weighted by the fixed decay "
                    "exp(-(k-1)/loss_gamma) (DFlash paper); `dpace`, D-PACE (arXiv 2605.18810): each slot weighted "
                    "by the accepted length it leads on to under the drafter's own smoothed confidence.",
        json_schema_extra=OUTPUT | calibrates("tau"),
    )
    dpace_alpha: FiniteFloat = Field(
        0.5, gt=0, le=1, description="D-PACE confidence smoothing: q~ = (1 - alpha) q + alpha (SpecForge's and "
        "speculators' default 0.5).", json_schema_extra=OUTPUT | calibrates("tau"))
    labels: Literal["data", "target"] = Field(
        "data",
        description="What a slot is trained to predict: `data`, the token in the training data; `target`, the "
                    "target's argmax at that position (what greedy verification accepts; differs from the data where "
                    "it was sampled at temperature > 0). `target` runs the target's forward to its last layer and "
                    "its LM head on the supervised positions.",
        json_schema_extra=OUTPUT | calibrates("tau"),
    )
    optimizer: Literal["adamw", "muon"] = Field(
        "muon",
        description="`adamw` for every weight, or `muon`: Muon (DeepSpeed's built-in, Newton-Schulz orthogonalised "
                    "momentum) for the 2-D matrices and AdamW for the rest (norms).",
                    json_schema_extra=OUTPUT | calibrates("tau"))
    muon_lr: FiniteFloat | None = Field(
        None, gt=0,
        description="Peak learning rate of the Muon matrices, in AdamW-matched units (the update's RMS scaled to "
                    "AdamW's, as torch.optim.Muon's `match_rms_adamw`); default: `lr` x the resolved factor "
                    "(docs/training.md).", json_schema_extra=OUTPUT | calibrates("tau"))
    muon_momentum: FiniteFloat = Field(0.95, gt=0, lt=1, description="Muon's Nesterov momentum.",
                                       json_schema_extra=OUTPUT | calibrates("tau"))
    schedule: Literal["cosine", "linear"] = Field(
        "cosine", description="Learning-rate decay after the linear warm-up, to 0 at the last step (every group).",
        json_schema_extra=OUTPUT | calibrates("tau"))
    selector_weight: FiniteFloat = Field(
        1.0, ge=0, description="DFlash2: weight of the path selector's k-way cross-entropy beside the backbone's "
        "loss (total = backbone + weight x ramp x selector; SpecForge, speculators and NeMo use 1.0).",
        json_schema_extra=OUTPUT | calibrates("tau"))
    selector_warmup_ratio: FiniteFloat = Field(
        0.04, ge=0, lt=1, description="DFlash2: share of the steps over which the selector loss's weight ramps "
        "linearly from 0 to `selector_weight`.", json_schema_extra=OUTPUT | calibrates("tau"))
    selector_gold_missing: Literal["skip", "swap"] = Field(
        "skip",
        description="DFlash2: a position whose label is not among the top-k candidates: `skip` leaves it out of the "
                    "selector loss (NeMo; SpecForge's docs), `swap` puts the label in place of the k-th candidate "
                    "(speculators).",
        json_schema_extra=OUTPUT | calibrates("tau"))
    master_weights: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="Precision of the optimizer's master weights, gradients and Adam moments on GPUs: `bf16` keeps "
                    "all in bf16 (DeepSpeed ZeRO 1 or 2 only; per drafter parameter 10 fewer bytes under AdamW, 6 "
                    "under Muon, on one GPU about 18 / 11 GB for a 27B target's 1.8B-parameter drafter) at some "
                    "risk to convergence late in a long run.",
        json_schema_extra=OUTPUT | calibrates("tau"),
    )


class ExportStage(StageBase):
    dtype: Literal["bf16", "fp16", "fp32"] = Field(
        "bf16", description="Weight dtype of the exported drafter (DFlash serving loads bf16, fp16 or fp32).",
        json_schema_extra=OUTPUT)


class BackupStage(StageBase):
    include_replaceable: bool = Field(
        True, description="Also copy replaceable artifacts, not only irreplaceable ones.", json_schema_extra=OUTPUT
    )


class Stages(Strict):
    ingest: IngestStage = Field(
        default_factory=IngestStage, description="Read, normalise, dedupe and shard the prompts.",
        json_schema_extra=OUTPUT | UNCALIBRATED
    )
    generate: GenerateStage = Field(
        default_factory=GenerateStage, description="Target completions (SGLang or transformers).",
        json_schema_extra=OUTPUT | BY_FIELD
    )
    qc: QCStage = Field(default_factory=QCStage, description="Quality gate on the completions.",
                        json_schema_extra=OUTPUT | UNCALIBRATED)
    tokenize: TokenizeStage = Field(
        default_factory=TokenizeStage, description="Chat template and loss masks into an Arrow dataset.",
        json_schema_extra=OUTPUT | BY_FIELD
    )
    train: TrainStage = Field(default_factory=TrainStage, description="DFlash drafter training (DeepSpeed).",
                              json_schema_extra=OUTPUT | BY_FIELD)
    eval: EvalStage = Field(
        default_factory=EvalStage, description="Acceptance evaluation of the trained drafter.",
        json_schema_extra=OUTPUT | UNCALIBRATED
    )
    export: ExportStage = Field(
        default_factory=ExportStage, description="The drafter as config.json + model.safetensors.",
        json_schema_extra=OUTPUT | UNCALIBRATED
    )
    backup: BackupStage = Field(
        default_factory=BackupStage, description="Copy the run's artifacts to S3 and verify them.",
        json_schema_extra=OUTPUT | UNCALIBRATED
    )


STAGE_ORDER: tuple[str, ...] = tuple(Stages.model_fields)
