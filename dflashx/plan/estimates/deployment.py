"""The trained drafter's speed-up where it will be served: tokens/s with and without it (pure).

`predict_speedup(recipe, acceptance, dims)` answers "how much faster will our endpoint be, at our
concurrency, on our GPUs": for each of `deploy.concurrencies` (requests in flight per server) one
server of the recipe's profile and serving settings (tp, weight dtype, KV dtype, memory fraction)
decodes the recipe's workload (its prompt and output lengths) twice:
  without   tokens/s = O / (O x step / b + prefill)                       (decode.py)
  with      tokens/s = O / (O x (verify + draft) / (b x tau) + prefill)   (speculative.py)
where the drafter is a DFlash drafter of `dims` served as SGLang's DFLASH serves it (the export's
serve command: --speculative-num-draft-tokens = block size, so B tokens verified per sequence, B-1
drafted), tau = 1 + the acceptance shares of positions 1..B-1, and b is the concurrency or what memory
holds (the drafter's weights, its KV and one linear-attention state per verified token come first).
The acceptance is the eval stage's measurement, or before training the recipe's expected profile
(`deploy`, resolved). On GPUs the engine is SGLang; on the CPU profile the in-process decoder (the
eval stage's), launch-bound: a measured fixed time per layer call (engine.py, IN_PROCESS).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

from dflashx.plan.estimates.device import device_of
from dflashx.plan.estimates.engine import deploy_row
from dflashx.plan.estimates.lengths import OutputLengths
from dflashx.plan.estimates.serving import running_batch_with
from dflashx.plan.estimates.speculative import dflash_drafter, drafter_window, pays, replica_rate
from dflashx.plan.explain import Term, term
from dflashx.resolve.flops import DrafterDims
from dflashx.resolve.model import ResolvedRecipe
from dflashx.resolve.speculative import accepted_length

FORMULA = ("speed-up = tokens/s with the drafter / without it, per server at each concurrency c; without: "
           "O / (O x step / b + prefill); with: O / (O x (verify of B tokens + drafter forward) / (b x tau) + "
           "prefill); tau = 1 + sum of the acceptance shares of positions 1..B-1; b = min(c, what memory holds)")


@dataclass(frozen=True)
class SpeedupRow:
    concurrency: int
    batch: int  # sequences decoded together without the drafter
    batch_drafter: int  # with it (its memory may hold fewer)
    tokens_per_second: float
    tokens_per_second_drafter: float
    speedup: float
    pays: bool
    cycle_s: float
    verify_s: float
    draft_s: float
    step_s: float


@dataclass(frozen=True)
class Deployment:
    """The prediction at each concurrency, with what it was made from."""

    profile: str
    tp: int
    block_size: int
    tau: float
    acceptance: list[float | None]
    acceptance_source: str
    prompt_tokens: float
    output_tokens: float
    rows: list[SpeedupRow]

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "tp": self.tp, "block_size": self.block_size, "tau": self.tau,
                "acceptance": list(self.acceptance), "acceptance_source": self.acceptance_source,
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens, "formula": FORMULA,
                "unit": "output tokens/s per server", "rows": [asdict(r) for r in self.rows]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Deployment:
        """From `to_json`'s dict (`formula` and `unit` are this module's constants)."""
        return cls(str(data["profile"]), int(data["tp"]), int(data["block_size"]), float(data["tau"]),
                   list(data["acceptance"]), str(data["acceptance_source"]), float(data["prompt_tokens"]),
                   float(data["output_tokens"]), [SpeedupRow(**r) for r in data["rows"]])


def _at(recipe: ResolvedRecipe, concurrency: int) -> ResolvedRecipe:
    """The recipe with `concurrency` requests in flight per server (the client's cap, whatever the backend)."""
    gen = recipe.stages.generate
    serving = gen.serving.model_copy(update={"max_running_requests": max(gen.serving.max_running_requests,
                                                                         concurrency)})
    gen = gen.model_copy(update={"concurrency": concurrency, "batch_size": concurrency, "serving": serving})
    return recipe.model_copy(update={"stages": recipe.stages.model_copy(update={"generate": gen})})


def predict_speedup(recipe: ResolvedRecipe, acceptance: Sequence[float | None], dims: DrafterDims,
                    block_size: int | None = None, window: int | None = None,
                    concurrencies: Sequence[int] | None = None, source: str = "measured") -> Deployment:
    """Tokens/s with and without a DFlash drafter of `dims` accepting `acceptance` (module doc)."""
    block = block_size or recipe.drafter.block_size
    lengths = OutputLengths.of(recipe.dataset.stats)
    prompt = recipe.dataset.stats.prompt_tokens_mean
    output = lengths.clipped_moment(1, recipe.stages.generate.max_tokens)
    dev = device_of(recipe.hardware)
    row = deploy_row(recipe.hardware.gpu is not None, recipe.target.facts.num_linear_layers > 0)
    tau = accepted_length(acceptance, block - 1)
    drafter = dflash_drafter(recipe, dims, block, window, tau)
    rows = []
    for c in concurrencies or recipe.deploy.concurrencies:
        at = _at(recipe, c)
        plain_b = running_batch_with(at, lengths, None)
        spec_b = running_batch_with(at, lengths, drafter.memory)
        plain = replica_rate(at, dev, plain_b, row, output, prompt)
        spec = replica_rate(at, dev, spec_b, row, output, prompt, drafter, acceptance)
        assert spec.verify is not None and spec.draft is not None, "a speculative rate has both steps"
        rows.append(SpeedupRow(c, plain_b.value, spec_b.value, plain.tokens_per_second, spec.tokens_per_second,
                               spec.tokens_per_second / plain.tokens_per_second, pays(spec, plain), spec.step_seconds,
                               spec.verify.seconds, spec.draft.seconds, plain.step_seconds))
    return Deployment(recipe.hardware.name, recipe.stages.generate.serving.tp, block, tau, list(acceptance), source,
                      prompt, output, rows)


def expected_speedup(recipe: ResolvedRecipe) -> Deployment:
    """Before training: the recipe's expected acceptance (`deploy`, resolved) on its own drafter."""
    return predict_speedup(recipe, recipe.deploy.acceptance, recipe.drafter.dims, window=drafter_window(recipe),
                           source=f"expected tau {recipe.deploy.expected_tau:.2f}: {recipe.deploy.tau_source}")


def deploy_term(prediction: Deployment) -> Term:
    """`--explain`'s view of a prediction: the speed-up at the first concurrency, every row as inputs."""
    rows = prediction.rows
    return term("deploy.speedup", rows[0].speedup, "x", FORMULA, profile=prediction.profile,
                tau=prediction.tau, block_size=prediction.block_size, source=prediction.acceptance_source,
                **{f"c{r.concurrency}": f"{r.speedup:.2f}x ({r.tokens_per_second:,.0f} -> "
                                        f"{r.tokens_per_second_drafter:,.0f} tok/s, batch {r.batch} / "
                                        f"{r.batch_drafter})" for r in rows})
