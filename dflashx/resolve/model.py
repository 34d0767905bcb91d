"""`ResolvedRecipe`: the recipe with every derived value filled in, typed and frozen.

It has the recipe's shape (it is a `Recipe`), and the sections that hold derived values are
subclasses of their schema sections in which those values are required: the drafter's tapped
layers, mask token and shapes, the train stage's batch arithmetic, γ, length, precisions and its
DeepSpeed config and launch command, the target's facts. `dflashx.resolve.resolve` is the one
function that builds it; `plan.json` stores it (`resolved`); every stage reads it through
`StageContext.recipe`. Each new field carries its stage-key role like the schema's own.
"""

# No `from __future__ import annotations` here: pydantic would evaluate every field's string
# annotation when the class is created, which `dflashx plan`'s start-up pays (benchmarks/cli_latency.py).

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, model_validator

from dflashx.config.fields import OPERATIONAL, OUTPUT, Precision
from dflashx.config.schema import (
    DeploySpec, DrafterSpec, EvalStage, EvalSuite, GenerateStage, Recipe, ServingSpec, SpeculativeSpec, Stages,
    TargetSpec, TrainStage,
)
from dflashx.resolve.flops import DrafterDims, drafter_dims
from dflashx.targets.registry import TargetFacts

_FROZEN = ConfigDict(frozen=True, defer_build=True)


class ResolvedTarget(TargetSpec):
    model_config = _FROZEN

    facts: TargetFacts = Field(description="Architecture facts of the target.", json_schema_extra=OPERATIONAL)
    load_precision: Precision = Field(
        description="Precision the target is loaded in on this hardware (fp32 on a CPU profile for bf16/fp16).",
        json_schema_extra=OPERATIONAL)


class ResolvedDrafter(DrafterSpec):
    model_config = _FROZEN

    target_layer_ids: list[int] = Field(description="Tapped target layers.", json_schema_extra=OUTPUT)
    mask_token_id: int = Field(description="Embedding row of the mask token.", json_schema_extra=OUTPUT)
    layer_types: list[Literal["full_attention", "sliding_attention"]] = Field(
        description="Attention type per drafter layer.", json_schema_extra=OUTPUT)
    intermediate_size: int = Field(ge=1, description="FFN width.", json_schema_extra=OUTPUT)
    hidden_size: int = Field(ge=1, description="The target's hidden size.", json_schema_extra=OUTPUT)
    num_attention_heads: int = Field(ge=1, description="The target's query heads.", json_schema_extra=OUTPUT)
    num_key_value_heads: int = Field(ge=1, description="The target's key/value heads.", json_schema_extra=OUTPUT)
    head_dim: int = Field(ge=1, description="The target's head width.", json_schema_extra=OUTPUT)
    vocab_size: int = Field(ge=1, description="The target's vocabulary (shared embedding and head).",
                            json_schema_extra=OUTPUT)

    @property
    def dims(self) -> DrafterDims:
        return drafter_dims(self, len(self.target_layer_ids))


class ResolvedTrainStage(TrainStage):
    model_config = _FROZEN

    @model_validator(mode="before")
    @classmethod
    def _argv_was_launch(cls, data: Any) -> Any:
        """plan.json written before issue 39 names `launch_argv` `launch` ("launch" now means only a stage's
        launch plan, `dflashx.plan.launch`)."""
        if isinstance(data, dict) and "launch" in data and "launch_argv" not in data:
            data = {("launch_argv" if k == "launch" else k): v for k, v in data.items()}
        return data

    micro_batch: int = Field(ge=1, description="Sequences per rank per micro step.", json_schema_extra=OPERATIONAL)
    zero_stage: Literal[0, 1, 2] = Field(description="DeepSpeed ZeRO stage.", json_schema_extra=OPERATIONAL)
    loss_gamma: float = Field(gt=0, description="Slot decay γ.", json_schema_extra=OUTPUT)
    max_length: int = Field(ge=8, description="Tokens per training sequence.", json_schema_extra=OUTPUT)
    world_size: int = Field(ge=1, description="Training processes (one per GPU).", json_schema_extra=OPERATIONAL)
    target_sharding: Literal["none", "zero3"] = Field(
        description="How the frozen online target is held: a whole copy per GPU (`none`) or partitioned over the "
                    "node's GPUs with DeepSpeed ZeRO-3 and gathered layer by layer (`zero3`).",
        json_schema_extra=OPERATIONAL)
    target_deepspeed_config: dict[str, Any] | None = Field(
        description="The DeepSpeed ZeRO-3 config that partitions the frozen target (`target_sharding: zero3`); "
                    "null when every rank holds a whole copy.", json_schema_extra=OPERATIONAL)
    grad_accum: int = Field(ge=1, description="Micro steps per optimizer step.", json_schema_extra=OPERATIONAL)
    precision: Literal["bf16", "fp32"] = Field(
        description="Drafter compute and weight precision (bf16 on GPUs, fp32 on a CPU profile or an fp32 target).",
        json_schema_extra=OPERATIONAL)
    peak_flops: float = Field(gt=0, description="Dense peak FLOP/s of one device (MFU's denominator).",
                              json_schema_extra=OPERATIONAL)
    # the recipe's bool | "auto", resolved into the trainer's three cases: a type of its own, narrower in meaning
    compile: Literal["on", "off", "when_it_pays"] = Field(  # type: ignore[assignment]
        description="torch.compile the drafter's layers: `on`/`off` as the recipe says; `when_it_pays` (`auto` on "
                    "a GPU): after the first eager steps, if the steps left save more than a cold compile costs "
                    "(`dflashx.resolve.compile_rule`).", json_schema_extra=OPERATIONAL)
    loss_kernel: Literal["liger", "torch"] = Field(
        description="Fused LM-head cross-entropy (`auto`: liger on GPUs for decay_ce, else torch).",
        json_schema_extra=OPERATIONAL)
    muon_lr: float | None = Field(gt=0, description="Muon matrices' peak learning rate, AdamW-matched (`lr` x the "
                                  "factor when unset); null under AdamW.", json_schema_extra=OUTPUT)
    deepspeed_config: dict[str, Any] = Field(description="The DeepSpeed config the engine is built with.",
                                             json_schema_extra=OPERATIONAL)
    launch_argv: list[str] = Field(description="argv of the train stage's launch ({run_dir} filled in by the stage).",
                                   json_schema_extra=OPERATIONAL)
    tau_prompts: int = Field(ge=0, description="Held-out prompts decoded per τ measurement while training (the first "
                             "of the ingest stage's eval_prompts; 0: none held out).", json_schema_extra=OPERATIONAL)
    tau_max_new_tokens: int = Field(ge=1, description="New tokens per held-out prompt in a τ measurement.",
                                    json_schema_extra=OPERATIONAL)


class ResolvedSpeculative(SpeculativeSpec):
    model_config = _FROZEN

    acceptance: list[float] = Field(
        description="Share of cycles accepting each draft position (the recipe's, else the published MTP profile).",
        json_schema_extra=OPERATIONAL)
    acceptance_source: str = Field(description="Where the profile comes from.", json_schema_extra=OPERATIONAL)


ServingMode = Literal["spawn", "attach", "in-process"]


def _spawn_was_launch(mode: object) -> object:
    """plan.json written before issue 39 says `launch` for `spawn` ("launch" now means only a stage's launch
    plan, `dflashx.plan.launch`)."""
    return "spawn" if mode == "launch" else mode


class ResolvedServing(ServingSpec):
    model_config = _FROZEN

    mode: Annotated[ServingMode, BeforeValidator(_spawn_was_launch)] = Field(
        description="Who runs the target for generation: spawn (dflashx starts the servers on the profile's "
        "GPUs), attach (servers at stages.generate.urls someone else started) or in-process (the transformers "
        "backend); `dflashx.resolve.serving.serving_mode`.", json_schema_extra=OPERATIONAL)

    speculative: ResolvedSpeculative = Field(description="MTP draft settings and acceptance, resolved.",
                                             json_schema_extra=OPERATIONAL)

    tp: int = Field(ge=1, description="Tensor-parallel GPUs per server.", json_schema_extra=OPERATIONAL)
    dp: int = Field(ge=1, description="Data-parallel replicas.", json_schema_extra=OPERATIONAL)
    dp_mode: Literal["router", "dp_size"] = Field(
        description="One server per replica behind sglang_router, or one server with --dp-size per node.",
        json_schema_extra=OPERATIONAL)
    weight_dtype: Precision = Field(description="Weights the servers run.", json_schema_extra=OUTPUT)
    checkpoint: str = Field(description="Checkpoint the servers load (--model-path).", json_schema_extra=OUTPUT)
    online_quantization: bool = Field(
        description="FP8 weights quantized while loading a 16-bit checkpoint (--quantization fp8).",
        json_schema_extra=OUTPUT)


class ResolvedGenerateStage(GenerateStage):
    model_config = _FROZEN

    context_length: int = Field(ge=1, description="SGLang --context-length.", json_schema_extra=OUTPUT)
    serving: ResolvedServing = Field(description="Serving settings, resolved.", json_schema_extra=OUTPUT)


class ResolvedSuite(EvalSuite):
    model_config = _FROZEN

    count: int = Field(ge=1, description="Most prompts decoded.", json_schema_extra=OUTPUT)

    @property
    def heldout(self) -> bool:
        """The run's own held-out prompts (stages.eval.prompts, else ingest.eval_prompts)."""
        return self.path is None and self.hf_id is None


class ResolvedEvalStage(EvalStage):
    model_config = _FROZEN

    # Narrows the base's field (pydantic validates the subclass); mypy rejects any override of a mutable
    # list attribute (list is invariant), though this model is frozen.
    suites: list[ResolvedSuite] = Field(  # type: ignore[assignment]
        description="Each suite's full definition (built-ins filled in).", json_schema_extra=OUTPUT)
    sampled_runs: int = Field(ge=0, description="Seeded decodes of every prompt with the trained drafter at "
                              "deploy.temperature (rejection sampling) beside the greedy one: "
                              "stages.eval.sampling_seeds when deploy.temperature > 0, else 0 (the baselines are "
                              "compared greedily).",
                              json_schema_extra=OUTPUT)
    decodes: int = Field(ge=1, description="Prompt decodes in all, at most: each suite's count x (the trained "
                         "drafter + the baselines, greedy, + sampled_runs of the trained drafter); the planner's eval "
                         "time.",
                         json_schema_extra=OPERATIONAL)


class ResolvedStages(Stages):
    model_config = _FROZEN

    eval: ResolvedEvalStage = Field(description="Acceptance evaluation, suites resolved.", json_schema_extra=OUTPUT)

    generate: ResolvedGenerateStage = Field(description="Target completions, serving resolved.",
                                            json_schema_extra=OUTPUT)

    train: ResolvedTrainStage = Field(description="DFlash drafter training, resolved.", json_schema_extra=OUTPUT)


class ResolvedDeploy(DeploySpec):
    model_config = _FROZEN

    expected_tau: float = Field(gt=1, description="tau expected of the drafter before training.",
                                json_schema_extra=OPERATIONAL)
    acceptance: list[float] = Field(description="Expected share of cycles accepting draft position 1..B-1.",
                                    json_schema_extra=OPERATIONAL)
    tau_source: str = Field(description="Where the expected tau comes from.", json_schema_extra=OPERATIONAL)


class ResolvedRecipe(Recipe):
    model_config = _FROZEN

    target: ResolvedTarget = Field(description="The target, with its facts.")
    drafter: ResolvedDrafter = Field(description="The drafter, every shape decided.")
    stages: ResolvedStages = Field(description="Each stage's parameters, train's derived values filled in.")
    deploy: ResolvedDeploy = Field(description="Where the drafter will be served, its expected acceptance resolved.")
