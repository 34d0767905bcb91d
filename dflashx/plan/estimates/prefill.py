"""A prompt's prefill (time to first token) on one serving replica (pure): the priced parts, and the token
mixers, whose time does not follow their FLOPs.

  prefill = weight GEMMs: 2 x active parameters but the routed experts x prompt, at the served precision's
            measured GEMM ceiling (engine.py GEMM / GEMM_FP8)
          + a draft's own pass over the prompt (the MTP head's layer, a DFlash drafter's context
            projections): its GEMMs, routed experts aside, at the 16-bit ceiling
          + attention core: attention layers (the target's and the MTP head's) x 4 x heads x head_dim x causal
            pairs (resolve.flops.attention_flops), at the 16-bit ceiling
          + routed experts: the target's MoE layers x moe.moe_layer(prompt) at the served precision, and an MoE
            MTP head's x moe.moe_layer(prompt) at 16 bits (as the draft's decode and its served weights: SGLang's
            eager path)
          + token mixers (SGLang on a GPU): what a Gated DeltaNet or attention layer costs beyond the FLOPs above
            (the chunked scan and short convolution, RoPE, norms, gating, and the attention kernel's shortfall
            against the ceiling as measured at MIXER_TOKENS: the core's quadratic FLOPs are priced above, the
            shortfall is carried per token, linear in the prompt, a stated approximation away from 8,192):
              sum over layer types of layers x rest(target, type) x prompt x MIXER_FACTOR
              x bandwidth(H200) / (bandwidth(GPU) x tp)
          + a launch-bound engine's layer calls (in-process, transformers rows).
  rest(target, type): seconds per token of one layer, measured with transformers on one H100
            (benchmarks/results/prefill_mixers.json, 8,192 tokens), less its projection and attention-core FLOPs
            at the H100's GEMM ceiling; a target or layer type without its own measurement scales the measured
            targets' mean per unit of mixer width (value heads x value head_dim; attention heads x head_dim).
  MIXER_FACTOR: SGLang on the H200 against transformers on the H100, from the one `source` row: the 27B's
            measured TTFT (734 ms, BF16, MTP on) less the priced parts above, over its transformers rest. One
            factor for both layer types (one row cannot split it); it also absorbs the H100 -> H200 step.
  Another GPU: the mixers scale with memory bandwidth (datasheet), not with FLOP/s: the scan's FLOPs are a few
            hundredths of its measured time and the rest is elementwise passes and launches (docs/planner.md
            gives the compute-ratio alternative as a sensitivity line).
Without a GPU or off SGLang (the in-process and transformers rows) there is no mixer term: the prompt's FLOPs
at the ceiling plus the engine's layer calls, as measured on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from dflashx.plan.estimates.decode import sixteen_bit
from dflashx.plan.estimates.device import Device, table_device
from dflashx.plan.estimates.engine import EngineRow, Measured, gemm_share
from dflashx.plan.estimates.moe import MoeLayer, moe_layer, routed_flops_per_token, serving_path
from dflashx.plan.expr import Expr, const, named, total, var
from dflashx.resolve.flops import attention_flops
from dflashx.resolve.model import ResolvedRecipe
from dflashx.targets.registry import REGISTRY, TargetFacts

_MIXERS = "benchmarks/results/prefill_mixers.json (python -m benchmarks.prefill_mixers)"
_H100 = ("1x NVIDIA H100 80GB HBM3, torch 2.11 + CUDA 13, transformers 5.17, flash-linear-attention 0.6.0 scan, "
         "causal_conv1d not installed (torch reference convolution), SDPA attention; 2026-12-06")
MIXER_TOKENS = 8192  # the prompt the mixer rows were measured at
LINEAR, ATTENTION = "linear_attention", "full_attention"
# One layer (token mixer + its two norms, a 1-wide MLP) at 8,192 tokens: the slope between 2- and 6-layer stacks.
MIXER_LAYERS: dict[tuple[str, str], Measured] = {
    ("Qwen/Qwen3.6-27B", LINEAR): Measured(9.294e-3, _MIXERS, "Gated DeltaNet layer: 9.294 ms", _H100),
    ("Qwen/Qwen3.6-27B", ATTENTION): Measured(7.161e-3, _MIXERS, "full-attention layer: 7.161 ms", _H100),
    ("Qwen/Qwen3.6-35B-A3B", LINEAR): Measured(5.189e-3, _MIXERS, "Gated DeltaNet layer: 5.189 ms", _H100),
    ("Qwen/Qwen3.6-35B-A3B", ATTENTION): Measured(3.507e-3, _MIXERS, "full-attention layer: 3.507 ms", _H100),
}
# The GPUs of the measurements: datasheet figures of the h100_x8 and h200_x1 profiles (a test keeps them equal).
MIXER_DEVICE = table_device("H100")
SOURCE_DEVICE = table_device("H200")
SOURCE_TARGET, SOURCE_PROMPT = "Qwen/Qwen3.6-27B", 8192.0
TTFT_SOURCE = Measured(
    0.734, "github.com/sgl-project/sglang docs_new/src/snippets/configs/qwen/qwen3.6-benchmarks.jsx @4b7077b "
           "(PR #32959)",
    "Qwen3.6-27B BF16 low-latency, conc 1: TTFT 734 ms for an 8,192-token prompt (planner_accuracy source row)",
    "1x H200, SGLang 0.5.16, TP 1, MTP on (EAGLE 3/1/4), one request at a time")


@dataclass(frozen=True)
class DraftPass:
    """A draft's own pass over each prompt token: its GEMM FLOPs (routed experts aside), the attention layers
    it runs over the prompt and its MoE layers."""

    gemm_flops_per_token: float = 0.0
    attention_layers: int = 0
    moe_layers: int = 0


def mtp_layer_params(facts: TargetFacts, active: bool = True) -> int:
    """The MTP head's layers: a full-attention decoder layer with the target's feed-forward (an MoE one's top-k
    experts when `active`) and `fc` over [embedding, hidden] (2 h^2)."""
    ffn = facts.moe_ffn_params(active=active) if facts.is_moe else facts.mlp_params
    return facts.mtp_layers * (facts.attention_params + ffn + 2 * facts.hidden_size**2)


def mtp_prompt_pass(facts: TargetFacts) -> DraftPass:
    """SGLang's draft extend over the prompt: every MTP layer once per prompt token (the routed experts of an MoE
    one counted in `moe_layers`, not in the GEMM FLOPs). The one derivation of the MTP head's dense and MoE
    share: `speculative.mtp_drafter` reads it too."""
    moe_layers = facts.mtp_layers if facts.is_moe else 0
    return DraftPass(2.0 * mtp_layer_params(facts) - routed_flops_per_token(facts, moe_layers), facts.mtp_layers,
                     moe_layers)


def mixer_width(facts: TargetFacts, layer_type: str) -> int:
    """A mixer's width: value heads x value head_dim (Gated DeltaNet), attention heads x head_dim."""
    if layer_type == LINEAR:
        return facts.linear_num_value_heads * facts.linear_value_head_dim
    return facts.num_attention_heads * facts.head_dim


def measured_rest(facts: TargetFacts, layer_type: str, m: Measured) -> float:
    """A measured layer's seconds per token beyond its projection and attention-core FLOPs at the measuring
    GPU's GEMM ceiling."""
    params = facts.linear_attention_params if layer_type == LINEAR else facts.attention_params
    flops = 2.0 * params * MIXER_TOKENS + (attention_flops(facts, [MIXER_TOKENS]) if layer_type != LINEAR else 0.0)
    return (m.value - flops / (MIXER_DEVICE.peak_flops("bf16") * gemm_share("bf16").value)) / MIXER_TOKENS


def rest_per_token(facts: TargetFacts, layer_type: str) -> float:
    """Transformers-on-H100 seconds per token of one layer of `layer_type` beyond its FLOPs (module doc)."""
    kind = LINEAR if layer_type == LINEAR else ATTENTION
    own = MIXER_LAYERS.get((facts.name, kind))
    if own is not None:
        return measured_rest(facts, kind, own)
    per_width = [measured_rest(REGISTRY[name], t, m) / mixer_width(REGISTRY[name], t)
                 for (name, t), m in MIXER_LAYERS.items() if t == kind]
    return mixer_width(facts, kind) * sum(per_width) / len(per_width)


def mixer_layers(facts: TargetFacts, draft: DraftPass) -> dict[str, int]:
    """Token-mixing layers a prefill runs: the target's, and the draft's attention layers."""
    return {LINEAR: facts.num_linear_layers, ATTENTION: facts.num_kv_layers + draft.attention_layers}


def transformers_rest(facts: TargetFacts, tokens: float, draft: DraftPass) -> float:
    """The mixers' rest over `tokens` prompt tokens, transformers on the H100 (linear in tokens)."""
    return sum(n * rest_per_token(facts, t) for t, n in mixer_layers(facts, draft).items() if n) * tokens


@dataclass(frozen=True)
class Prefill:
    weight_gemm_s: float
    draft_gemm_s: float
    attention_s: float
    mixer_s: float
    fixed_s: float = 0.0
    moe: MoeLayer | None = None
    moe_layers: int = 0
    mixer_rest_s: float = 0.0  # transformers-on-H100 rest the mixer term scales (0: no mixer term)
    draft_moe: MoeLayer | None = None  # the draft's MoE layers, experts in 16 bits (an MoE MTP head)
    draft_moe_layers: int = 0

    @property
    def moe_s(self) -> float:
        return self.time_of_moe.value

    @cached_property
    def time_of_moe(self) -> Expr:
        """The routed experts: the target's MoE layers x one layer's `moe_layer`, and an MoE draft's."""
        target = var("moe_layer_s", self.moe.seconds) * var("moe_layers", self.moe_layers) if self.moe \
            else const(0.0)
        if self.draft_moe is None:
            return target
        return target + var("draft_moe_layer_s", self.draft_moe.seconds) * var("draft_moe_layers",
                                                                               self.draft_moe_layers)

    @cached_property
    def time(self) -> Expr:
        """The prefill's seconds: its parts one after another (module doc)."""
        return total(var("weight_gemm_s", self.weight_gemm_s), var("draft_gemm_s", self.draft_gemm_s),
                     var("attention_s", self.attention_s), var("mixer_s", self.mixer_s), var("fixed_s", self.fixed_s),
                     named("moe_s", self.time_of_moe))

    @property
    def seconds(self) -> float:
        return self.time.value


def priced(facts: TargetFacts, dev: Device, tp: int, dtype: str, prompt: float, on_gpu: bool, engine: str,
           draft: DraftPass = DraftPass(), fixed_s: float = 0.0) -> Prefill:
    """The prefill's FLOP-priced parts, routed experts and layer calls (module doc); no mixer term."""
    ref = sixteen_bit(dtype)
    rate_ref = dev.peak_flops(ref) * tp * gemm_share(ref).value
    rate = dev.peak_flops(dtype) * tp * gemm_share(dtype if on_gpu else "bf16").value
    weights = 2.0 * facts.params_through_layer(facts.num_layers - 1, active=True) * prompt
    weights -= routed_flops_per_token(facts, facts.num_moe_layers) * prompt
    attention = attention_flops(facts, [prompt]) * mixer_layers(facts, draft)[ATTENTION]
    path = serving_path(engine, on_gpu, graphed=False)
    moe = moe_layer(facts, prompt, dtype, dev, path, tp) if facts.is_moe else None
    draft_moe = moe_layer(facts, prompt, ref, dev, path, tp) if draft.moe_layers else None
    return Prefill(weights / rate, draft.gemm_flops_per_token * prompt / rate_ref, attention / rate_ref, 0.0,
                   fixed_s, moe, facts.num_moe_layers if moe else 0, draft_moe=draft_moe,
                   draft_moe_layers=draft.moe_layers)


@dataclass(frozen=True)
class MixerFactor:
    """SGLang's mixer time on the H200 over transformers' rest on the H100, from the source row."""

    value: float
    ttft_s: float
    priced_s: float
    rest_s: float

    def inputs(self) -> dict[str, float | str]:
        return {"factor": self.value, "source_ttft_s": self.ttft_s, "source_priced_s": self.priced_s,
                "source_transformers_rest_s": self.rest_s,
                "source": f"{TTFT_SOURCE.source}: {TTFT_SOURCE.figure} ({TTFT_SOURCE.conditions}); rest: {_MIXERS}"}


def mixer_factor() -> MixerFactor:
    """The source row less its priced parts, over its transformers rest (module doc)."""
    facts = REGISTRY[SOURCE_TARGET]
    draft = mtp_prompt_pass(facts)
    known = priced(facts, SOURCE_DEVICE, 1, "bf16", SOURCE_PROMPT, True, "sglang", draft).seconds
    rest = transformers_rest(facts, SOURCE_PROMPT, draft)
    return MixerFactor((TTFT_SOURCE.value - known) / rest, TTFT_SOURCE.value, known, rest)


def prefill_of(facts: TargetFacts, dev: Device, tp: int, dtype: str, prompt: float, on_gpu: bool, engine: str,
               draft: DraftPass = DraftPass(), fixed_s: float = 0.0) -> Prefill:
    """A prompt's prefill on one replica of `tp` GPUs (module doc)."""
    base = priced(facts, dev, tp, dtype, prompt, on_gpu, engine, draft, fixed_s)
    if not (on_gpu and engine == "sglang"):
        return base
    rest = transformers_rest(facts, prompt, draft)
    scale = mixer_factor().value * SOURCE_DEVICE.bandwidth_bps / (dev.bandwidth_bps * tp)
    return replace(base, mixer_s=rest * scale, mixer_rest_s=rest)


def scan_seconds(facts: TargetFacts, dev: Device, tp: int, tokens: float) -> float:
    """The linear-attention layers' mixer term (module doc) over `tokens` tokens: what a speculative verify's
    tokens beyond one per sequence cost in the scan, the short convolution and the gating, which a decode step's
    engine share (measured at one token per sequence) does not hold (speculative.py); 0 for attention-only
    targets (attention's rest was measured at 8,192 tokens of context, not a verify's)."""
    if not facts.num_linear_layers or tokens <= 0:
        return 0.0
    rest = facts.num_linear_layers * rest_per_token(facts, LINEAR) * tokens
    return rest * mixer_factor().value * SOURCE_DEVICE.bandwidth_bps / (dev.bandwidth_bps * tp)


def prefill(recipe: ResolvedRecipe, dev: Device, prompt: float, dtype: str, row: EngineRow,
            draft: DraftPass = DraftPass(), fixed_s: float = 0.0) -> Prefill:
    """The resolved recipe's prefill of a `prompt`-token prompt on the engine of `row` (module doc)."""
    return prefill_of(recipe.target.facts, dev, recipe.stages.generate.serving.tp, dtype, prompt,
                      recipe.hardware.gpu is not None, row.engine, draft, fixed_s)
