"""Recipe schema: speculative decoding — the target's MTP head while generating, and where the
trained drafter will be served (the planner predicts its speed-up there).

`stages.generate.serving.speculative` holds SGLang's draft settings for `target.mtp: true`, with the
defaults of SGLang's Qwen3.6 cookbook low-latency cells (`--speculative-algorithm EAGLE
--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4`,
sgl-project/sglang docs_new/src/snippets/configs/qwen/qwen3.6.jsx @4b7077b; SGLang reads NEXTN as
EAGLE). `deploy` says how the drafter will be served (the sampling settings its acceptance is measured
at: greedy, or temperature / top_p / top_k with rejection sampling), at which concurrencies its
speed-up is predicted and, before any training, which tau to expect. docs/planner.md ("Speculative
decoding") has the model and sources, docs/evaluation.md the measurement.
"""

# No `from __future__ import annotations` here: pydantic would evaluate every field's string
# annotation when the class is created, which `dflashx plan`'s start-up pays (benchmarks/cli_latency.py).

from typing import Literal

from pydantic import Field, model_validator

from dflashx.config.fields import OPERATIONAL, OUTPUT, FiniteFloat, Strict

Share = FiniteFloat


class SpeculativeSpec(Strict):
    """SGLang's draft-verify settings for the target's own MTP head (used when `target.mtp` is true)."""

    algorithm: Literal["EAGLE", "NEXTN"] = Field(
        "EAGLE", description="--speculative-algorithm (SGLang runs NEXTN as EAGLE).", json_schema_extra=OPERATIONAL)
    num_steps: int = Field(3, ge=1, description="--speculative-num-steps: MTP forwards (drafted tokens) per cycle.",
                           json_schema_extra=OPERATIONAL)
    eagle_topk: int = Field(1, ge=1, description="--speculative-eagle-topk (1: a chain of drafts).",
                            json_schema_extra=OPERATIONAL)
    num_draft_tokens: int = Field(
        4, ge=2, description="--speculative-num-draft-tokens: tokens the target verifies per sequence and cycle "
        "(num_steps + 1 for a chain).", json_schema_extra=OPERATIONAL)
    acceptance: list[Share] | None = Field(
        None, description="Share of cycles accepting draft position k = 1, 2, ... (a planning figure). Default: the "
        "published profile of the target's MTP head (docs/planner.md); a pilot measures the real accepted length.",
        json_schema_extra=OPERATIONAL)

    @model_validator(mode="after")
    def _chain(self) -> "SpeculativeSpec":
        if self.eagle_topk == 1 and self.num_draft_tokens != self.num_steps + 1:
            raise ValueError(f"with eagle_topk 1 the drafts form a chain: num_draft_tokens must be num_steps + 1 = "
                             f"{self.num_steps + 1}, not {self.num_draft_tokens}")
        if self.acceptance and any(not 0 <= a <= 1 for a in self.acceptance):
            raise ValueError("acceptance holds shares of cycles: each between 0 and 1")
        return self


class DeploySpec(Strict):
    """Where and how the trained drafter will be served: the eval stage measures its acceptance at these
    sampling settings, and the planner and the eval stage predict its speed-up here (the recipe's hardware
    profile and serving settings, SGLang's DFLASH verify of `block_size` tokens)."""

    temperature: FiniteFloat = Field(
        0.0, ge=0, description="Sampling temperature the target will be served at; above 0 the server verifies "
        "drafts by rejection sampling, whose acceptance differs from the greedy one, so the eval stage also "
        "measures tau there (stages.eval.sampling_seeds seeds) and the predicted speed-up uses that tau. "
        "Default 0 (greedy): the setting every published DFlash tau is measured at, and the only one that "
        "fits any target; set the target's served settings (Qwen3.6 thinking: 0.6, top_p 0.95, top_k 20, "
        "its model card; recipes/qwen36_27b.yaml does).", json_schema_extra=OUTPUT)
    top_p: FiniteFloat = Field(
        1.0, gt=0, le=1, description="Nucleus sampling when temperature > 0: the smallest set of most likely "
        "tokens whose probability reaches top_p (1: all); the target's distribution, and a DFlash drafter's, "
        "filtered alike, as the reference decoder does. "
        "No effect at temperature 0.", json_schema_extra=OUTPUT)
    top_k: int = Field(
        0, ge=0, description="Sample only among the top_k most likely tokens when temperature > 0 (0: all; applied "
        "before top_p). No effect at temperature 0.", json_schema_extra=OUTPUT)

    concurrencies: list[int] = Field(
        default_factory=lambda: [1, 8, 32, 128], min_length=1,
        description="Requests in flight per server at which tokens/s with and without the drafter are predicted.",
        json_schema_extra=OPERATIONAL)
    expected_tau: FiniteFloat | None = Field(
        None, gt=1, description="Accepted tokens per draft-verify cycle expected before training at deploy.temperature "
        "(the plan's figure); default: the published DFlash figure for the block size (docs/planner.md), measured "
        "greedily. The eval stage's measured acceptance at deploy.temperature replaces it.",
        json_schema_extra=OPERATIONAL)

    @model_validator(mode="after")
    def _positive(self) -> "DeploySpec":
        if any(c < 1 for c in self.concurrencies):
            raise ValueError("concurrencies are requests in flight: each at least 1")
        return self
