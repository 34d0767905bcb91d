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

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from dflashx.plan.estimates.device import device_of
from dflashx.plan.estimates.engine import deploy_row
from dflashx.plan.estimates.lengths import OutputLengths
from dflashx.plan.estimates.serving import Batch, running_batch_with
from dflashx.plan.estimates.speculative import Drafter, Rate, dflash_drafter, drafter_window, pays, replica_rate
from dflashx.plan.expand.switch_off import SwitchOff, switch_off_settings
from dflashx.plan.explain import Term, term
from dflashx.resolve.flops import DrafterDims
from dflashx.resolve.model import ResolvedRecipe
from dflashx.resolve.speculative import accepted_length



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
    verify_compute_s: float = 0.0  # the verify forward's parts at their compute ceilings (decode.py), summed
    verify_memory_s: float = 0.0  # and at their memory ceiling
    verify_efficiency: float = 1.0  # the weight GEMMs' efficiency at the verify's tokens (gemm.py)
    verify_tokens: int = 0  # batch x verified tokens per sequence: the rows of the verify forward's GEMMs


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
    switch_off_above: int | None = None  # the drafter stops paying above this concurrency (None: pays on the grid)
    switch_off: list[SwitchOff] = field(default_factory=list)  # each engine's way to act on it (expand/switch_off.py)
    formula: str = ""  # rendered from the expressions that computed the rows (`_formula`)

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "tp": self.tp, "block_size": self.block_size, "tau": self.tau,
                "acceptance": list(self.acceptance), "acceptance_source": self.acceptance_source,
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens, "formula": self.formula,
                "unit": "output tokens/s per server", "rows": [asdict(r) for r in self.rows],
                "switch_off_above": self.switch_off_above, "switch_off": [asdict(s) for s in self.switch_off]}

    @property
    def crossover(self) -> str:
        """Where the drafter stops paying, in words (the plan's deployment line and `--explain`)."""
        above, grid = self.switch_off_above, [r.concurrency for r in self.rows]
        if above is None:
            return f"pays at every concurrency of the grid (up to {max(grid)}): no crossover inside it"
        if above == 0:
            return f"does not pay at any concurrency of the grid (from {min(grid)})"
        return f"stops paying above {above} requests in flight: turn speculation off above {above}"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Deployment:
        """From `to_json`'s dict (`unit` is this module's constant)."""
        return cls(str(data["profile"]), int(data["tp"]), int(data["block_size"]), float(data["tau"]),
                   list(data["acceptance"]), str(data["acceptance_source"]), float(data["prompt_tokens"]),
                   float(data["output_tokens"]), [SpeedupRow(**r) for r in data["rows"]],
                   data.get("switch_off_above"), [SwitchOff(**x) for x in data.get("switch_off", [])],
                   str(data["formula"]))


def _at(recipe: ResolvedRecipe, concurrency: int) -> ResolvedRecipe:
    """The recipe with `concurrency` requests in flight per server (the client's cap, whatever the backend)."""
    gen = recipe.stages.generate
    serving = gen.serving.model_copy(update={"max_running_requests": max(gen.serving.max_running_requests,
                                                                         concurrency)})
    gen = gen.model_copy(update={"concurrency": concurrency, "batch_size": concurrency, "serving": serving})
    return recipe.model_copy(update={"stages": recipe.stages.model_copy(update={"generate": gen})})


def _rates(recipe: ResolvedRecipe, drafter: Drafter, acceptance: Sequence[float | None],
           concurrency: int) -> tuple[Batch, Batch, Rate, Rate]:
    """(batch without, batch with, rate without, rate with) of one server at `concurrency`."""
    lengths = OutputLengths.of(recipe.dataset.stats)
    prompt = recipe.dataset.stats.prompt_tokens_mean
    output = lengths.clipped_moment(1, recipe.stages.generate.max_tokens)
    dev = device_of(recipe.hardware)
    row = deploy_row(recipe.hardware.gpu is not None, recipe.target.facts.num_linear_layers > 0)
    at = _at(recipe, concurrency)
    plain_b = running_batch_with(at, lengths, None)
    spec_b = running_batch_with(at, lengths, drafter.memory)
    return plain_b, spec_b, replica_rate(at, dev, plain_b, row, output, prompt), replica_rate(
        at, dev, spec_b, row, output, prompt, drafter, acceptance)


def _formula(plain: Rate, spec: Rate) -> str:
    """The speed-up's formula, rendered from the rates' own expressions (`speculative.replica_rate`)."""
    return ("speed-up = tokens/s with the drafter / without it, per server at each concurrency c, batch = min(c, "
            f"what memory holds); without: {plain.throughput.formula()}; with: {spec.throughput.formula()}; "
            "tau = 1 + the acceptance shares of positions 1..B-1")


def speedup_row(recipe: ResolvedRecipe, drafter: Drafter, acceptance: Sequence[float | None],
                concurrency: int) -> SpeedupRow:
    """One server of the recipe decoding its workload at `concurrency` with and without `drafter` (module doc)."""
    return _row(concurrency, drafter, *_rates(recipe, drafter, acceptance, concurrency))


def _row(concurrency: int, drafter: Drafter, plain_b: Batch, spec_b: Batch, plain: Rate, spec: Rate) -> SpeedupRow:
    assert spec.verify is not None and spec.draft is not None, "a speculative rate has both steps"
    return SpeedupRow(concurrency, plain_b.value, spec_b.value, plain.tokens_per_second, spec.tokens_per_second,
                      spec.tokens_per_second / plain.tokens_per_second, pays(spec, plain), spec.step_seconds,
                      spec.verify.seconds, spec.draft.seconds, plain.step_seconds,
                      spec.verify.served.compute_s, spec.verify.served.memory_s, spec.verify.served.efficiency,
                      spec_b.value * drafter.verify_tokens)


def switch_off_above(recipe: ResolvedRecipe, drafter: Drafter, acceptance: Sequence[float | None],
                     rows: Sequence[SpeedupRow]) -> int | None:
    """The largest concurrency at which the drafter still pays, below the grid's first concurrency where it does
    not (found between the two grid points by bisection: the speed-up is taken to cross 1 once there); None when
    it pays at every concurrency of the grid, 0 when it pays at none."""
    first = next((i for i, r in enumerate(rows) if not r.pays), None)
    if first is None:
        return None
    if first == 0:
        return 0
    low, high = rows[first - 1].concurrency, rows[first].concurrency
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if speedup_row(recipe, drafter, acceptance, mid).pays else (low, mid)
    return low


def predict_with(recipe: ResolvedRecipe, drafter: Drafter, acceptance: Sequence[float | None], block: int,
                 concurrencies: Sequence[int], source: str) -> Deployment:
    """Tokens/s with and without any `drafter` at each concurrency, and where speculation stops paying."""
    rated = [_rates(recipe, drafter, acceptance, c) for c in concurrencies]
    rows = [_row(c, drafter, *r) for c, r in zip(concurrencies, rated)]
    above = switch_off_above(recipe, drafter, acceptance, rows)
    lengths = OutputLengths.of(recipe.dataset.stats)
    return Deployment(recipe.hardware.name, recipe.stages.generate.serving.tp, block,
                      accepted_length(acceptance, drafter.drafts), list(acceptance), source,
                      recipe.dataset.stats.prompt_tokens_mean,
                      lengths.clipped_moment(1, recipe.stages.generate.max_tokens), rows, above,
                      switch_off_settings(drafter.method, block, above, drafter.drafts),
                      _formula(*rated[0][2:]))


def predict_speedup(recipe: ResolvedRecipe, acceptance: Sequence[float | None], dims: DrafterDims,
                    block_size: int | None = None, window: int | None = None,
                    concurrencies: Sequence[int] | None = None, source: str = "measured") -> Deployment:
    """Tokens/s with and without a DFlash drafter of `dims` accepting `acceptance` (module doc)."""
    block = block_size or recipe.drafter.block_size
    drafter = dflash_drafter(recipe, dims, block, window, accepted_length(acceptance, block - 1))
    return predict_with(recipe, drafter, acceptance, block, concurrencies or recipe.deploy.concurrencies, source)


def expected_speedup(recipe: ResolvedRecipe) -> Deployment:
    """Before training: the recipe's expected acceptance (`deploy`, resolved) on its own drafter."""
    return predict_speedup(recipe, recipe.deploy.acceptance, recipe.drafter.dims, window=drafter_window(recipe),
                           source=f"expected tau {recipe.deploy.expected_tau:.2f}: {recipe.deploy.tau_source}")


def _verify_cell(r: SpeedupRow) -> str:
    """One concurrency's verify forward: its rows, how it is bound, the GEMMs' efficiency (decode.py)."""
    bound = "compute" if r.verify_compute_s >= r.verify_memory_s else "memory"
    return (f"{r.verify_tokens} verified tokens, {r.verify_s * 1e3:.2f} ms (parts at memory "
            f"{r.verify_memory_s * 1e3:.2f} / compute {r.verify_compute_s * 1e3:.2f} ms: {bound}-bound, GEMM "
            f"efficiency {r.verify_efficiency:.2f}), draft {r.draft_s * 1e3:.2f} ms, plain step "
            f"{r.step_s * 1e3:.2f} ms")


def deploy_term(prediction: Deployment) -> Term:
    """`--explain`'s view of a prediction: the speed-up at the first concurrency, every row as inputs, the verify
    forward's terms per concurrency and the crossover with each engine's switch."""
    rows = prediction.rows
    return term("deploy.speedup", rows[0].speedup, "x", prediction.formula, profile=prediction.profile,
                tau=prediction.tau, block_size=prediction.block_size, source=prediction.acceptance_source,
                **{f"c{r.concurrency}": f"{r.speedup:.2f}x ({r.tokens_per_second:,.0f} -> "
                                        f"{r.tokens_per_second_drafter:,.0f} tok/s, batch {r.batch} / "
                                        f"{r.batch_drafter})" for r in rows},
                **{f"verify_c{r.concurrency}": _verify_cell(r) for r in rows},
                crossover=prediction.crossover,
                **{f"switch_off {s.engine}": s.text for s in prediction.switch_off})
