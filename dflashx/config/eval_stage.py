"""Recipe schema: the eval stage (`stages.eval`) and its suites and baselines."""

# No `from __future__ import annotations` here: pydantic would evaluate every field's string
# annotation when the class is created, which `dflashx plan`'s start-up pays (benchmarks/cli_latency.py).

from typing import Literal

from pydantic import Field, field_validator, model_validator

from dflashx.config.eval_suites import (
    BUILTIN_BASELINES, BUILTIN_SUITES, HELDOUT, TRAINED, UNTRAINED, known_names, template_fields, unique_names,
)
from dflashx.config.fields import OPERATIONAL, OUTPUT, PATH, StageBase, Strict, key_problem

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
def _named(value: object) -> object:
    """A bare name in a list of suites or baselines is short for `{name: ...}`."""
    return {"name": value} if isinstance(value, str) else value


class EvalSuite(Strict):
    """A named prompt set the eval stage decodes: a local file, a `datasets` id, or (by its name) a
    built-in suite whose definition the other keys override (docs/evaluation.md, "Suites")."""

    name: str = Field(pattern=_NAME, description="Suite name in eval.json, the plot and `dflashx compare`; a "
                      "built-in's name (heldout, gsm8k, math500, humaneval, mbpp, mt-bench, alpaca) takes its "
                      "definition. A bare name in the list is short for {name: ...}.", json_schema_extra=OUTPUT)
    path: str | None = Field(None, description="Local .jsonl/.json/.parquet file or folder of records (or a "
                             "`builtin:` prompt file).", json_schema_extra=PATH)
    hf_id: str | None = Field(None, description="`datasets` id (needs network).", json_schema_extra=OUTPUT)
    hf_config: str | None = Field(None, description="`datasets` configuration name.", json_schema_extra=OUTPUT)
    split: str = Field("test", description="`datasets` split.", json_schema_extra=OUTPUT)
    format: Literal["auto", "messages", "sharegpt", "alpaca", "function_calling", "prompt"] = Field(
        "auto", description="Record layout, as for dataset.sources (unused with `template`).", json_schema_extra=OUTPUT)
    fields: dict[str, str] = Field(default_factory=dict, description="Field mapping, as for dataset.sources, e.g. "
                                   "{prompt: question}.", json_schema_extra=OUTPUT)
    template: str | None = Field(None, description="The user turn written from the record's fields, e.g. "
                                 "'{question}\\nAnswer briefly.' or '{prompt[0]}'; replaces format and fields.",
                                 json_schema_extra=OUTPUT)
    count: int | None = Field(None, ge=1, description="Most prompts decoded; default stages.eval.num_prompts.",
                              json_schema_extra=OUTPUT)
    sample_seed: int | None = Field(None, description="Pick the prompts as z-lab's benchmark script does: the "
                                    "records shuffled by random.Random(seed), then the first `count`; null: the "
                                    "first `count` records.", json_schema_extra=OUTPUT)

    @model_validator(mode="after")
    def _location(self) -> "EvalSuite":
        if self.path is not None and self.hf_id is not None:
            raise ValueError(f"suite {self.name!r}: give one of `path` (local file) or `hf_id` (datasets id)")
        if self.name == HELDOUT and (self.path or self.hf_id):
            raise ValueError(f"suite {HELDOUT!r} is the run's held-out prompts: set stages.eval.prompts to read "
                             "them from a file, or give this suite another name")
        if self.path is None and self.hf_id is None:
            known_names([self.name], BUILTIN_SUITES, "suite", "give it a `path` (local file) or an `hf_id`")
        if self.template is not None:
            template_fields(self.template)
        return self


class EvalBaseline(Strict):
    """A drafter evaluated beside the trained one: `untrained`, or a folder in the z-lab / SGLang
    layout or the speculators layout (e.g. a drafter published for the same target)."""

    name: str = Field(pattern=_NAME, description="Drafter name in eval.json, the plot and `dflashx compare`; "
                      "`untrained` is the built-in baseline (a bare name is short for {name: ...}).",
                      json_schema_extra=OUTPUT)
    path: str | None = Field(None, description="Drafter folder (config.json + model.safetensors) or a hub id "
                             "such as z-lab/Qwen3.6-27B-DFlash (downloaded on first use).", json_schema_extra=PATH)

    @model_validator(mode="after")
    def _location(self) -> "EvalBaseline":
        if self.name == UNTRAINED and self.path is not None:
            raise ValueError(f"baseline {UNTRAINED!r} is built in (the trained drafter's config, seeded init); "
                             "give your folder another name")
        if self.path is None:
            known_names([self.name], BUILTIN_BASELINES, "baseline", "give it a `path` (a drafter folder)")
        return self


class EvalStage(StageBase):
    num_prompts: int = Field(64, ge=1, description="Prompts evaluated per suite (unless the suite sets `count`).",
                             json_schema_extra=OUTPUT)
    max_new_tokens: int = Field(
        256, ge=1, description="Tokens generated per prompt while measuring acceptance.", json_schema_extra=OUTPUT
    )
    sampling_seeds: int = Field(
        5, ge=2, description="When deploy.temperature > 0: how often every suite is decoded with the trained drafter "
        "(the one whose tau predicts the served speed-up; the baselines are compared greedily) at the serving sampling "
        "settings (rejection sampling; the N runs decode as one batch from a generator seeded 0) beside the greedy "
        "decode; tau there is reported as the mean over the seeds with its 95% interval (Student's t over the "
        "seeds; at least 2 seeds). Each seed adds about one greedy decode's work (on a GPU less: one batch). "
        "Keyed through the resolved `sampled_runs` (0 when greedy).",
        json_schema_extra=OPERATIONAL)
    prompts: str | None = Field(None, description="JSONL of held-out prompts (the `heldout` suite); default: "
                                "dataset.eval_holdout.", json_schema_extra=PATH)
    suites: list[EvalSuite] = Field(
        default_factory=lambda: [HELDOUT], validate_default=True, min_length=1,
        description="Prompt sets to decode, each a built-in name (heldout, gsm8k, math500, humaneval, mbpp, "
                    "mt-bench, alpaca) or {name, path | hf_id, ...}; the first is the headline one.",
        json_schema_extra=OUTPUT)
    baselines: list[EvalBaseline] = Field(
        default_factory=lambda: [UNTRAINED], validate_default=True,
        description="Drafters decoded beside the trained one on every suite: `untrained` or {name, path} of a "
                    "drafter folder (z-lab or speculators layout).",
        json_schema_extra=OUTPUT)
    engine: Literal["vllm"] | None = Field(
        None, description="Also measure the trained drafter through a real serving engine: `vllm` serves the target "
        "with the drafter (the layout vLLM serves, as the export writes it) and without it, and decodes the first "
        "suite's prompts greedily one at a time on each: the engine's own acceptance counters (tau, acceptance per "
        "draft position) beside our decoder's, and its tokens/s with and without the drafter, a measured speed-up "
        "beside the predicted one (eval.json `engine`). vLLM starts from stages.generate.server_python (default: "
        "this interpreter); on a CPU profile its CPU build (README). null: our decoder only.",
        json_schema_extra=OUTPUT)

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: object) -> object:
        if isinstance(data, dict) and "temperature" in data:
            raise key_problem("temperature", "moved to deploy.temperature (with deploy.top_p, deploy.top_k): the eval "
                              "measures tau greedily and at the temperature the drafter will be served at",
                              "remove stages.eval.temperature and set deploy.temperature (on the command line: "
                              "deploy.temperature=VALUE)")
        return data

    @field_validator("suites", "baselines", mode="before")
    @classmethod
    def _bare_names(cls, items: object) -> object:
        return [_named(item) for item in items] if isinstance(items, list) else items

    @field_validator("suites")
    @classmethod
    def _unique_suites(cls, suites: list[EvalSuite]) -> list[EvalSuite]:
        return unique_names(suites, "suite")

    @field_validator("baselines")
    @classmethod
    def _unique_baselines(cls, baselines: list[EvalBaseline]) -> list[EvalBaseline]:
        return unique_names(baselines, "baseline", reserved=(TRAINED,))
