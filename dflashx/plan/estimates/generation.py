"""Generation time: SGLang's batched decode and prefill, predicted from facts (no fitted factor).

Per replica (a TP group of `tp` GPUs) decoding `batch` sequences (`serving.running_batch`):
  bytes/step = decoder weights + LM head + batch x (KV bytes/token x mean context + 2 x state)
               (every step reads the weights and each sequence's KV, reads and writes its state)
  FLOPs/step = batch x (2 x matmul parameters + 4 x context x heads x head_dim x attention layers)
  roofline   = max(bytes / (bandwidth x tp x copy share), FLOPs / (peak x tp x GEMM share))
               (both shares measured; GEMM share per precision)
  step       = roofline(served weights) + roofline(16-bit weights) x (1 / decode share - 1)
               + TP all-reduce (2 per layer, ring over the interconnect:
               latency + 2 (tp-1)/tp x batch x hidden x 2 bytes / link bandwidth)
  prefill    = weight GEMMs at the served precision's ceiling + attention core and a draft's pass at the
               16-bit ceiling + routed experts (moe.py) + the token mixers (prefill.py: measured per layer,
               scaled from the TTFT source row) + its all-reduces
  tokens/s   = dp x Ō / (Ō x step / batch + prefill) x calibration
With `target.mtp` (SGLang running the target's MTP head) a step is a draft-verify cycle that yields
tau tokens per sequence (`speculative.py`): tokens/s = dp x Ō / (Ō x cycle / (batch x tau) + prefill)
x calibration, at the batch the MTP head's memory leaves; the plan compares it with MTP off
(`generate.speculation`) and says whether it pays.
The decode share was measured with 16-bit weights: the part of a step they stand for beyond the
roofline (launch gaps, normalizations, sampling, the linear-attention scan) does not get faster with
FP8 weights, which speed up only the weight reads and the weight matrix products (Amdahl).
The share is an engine fact with their sources (`engine.py`); `calibration` is
`hardware.calibrated.serving_ratio` (measured / this model's prediction on the rented node), 1 when
none. `estimate_generation` takes the output-length distribution so that ranges can call it per
scenario.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.plan.estimates.decode import COPY_BANDWIDTH, target_step
from dflashx.plan.estimates.device import CALIBRATED_SERVING, Device, device_of, factor
from dflashx.plan.estimates.engine import EngineRow, engine_row
from dflashx.plan.estimates.lengths import Lengths
from dflashx.plan.estimates.prefill import mixer_factor
from dflashx.plan.estimates.serving import Batch, mtp_on, running_batch, running_batch_with
from dflashx.plan.estimates.speculative import GenerationDraft, Rate, generation_draft, pays, replica_rate
from dflashx.plan.expand.draft import generation_draft_text
from dflashx.plan.estimates.tokens import Tokens
from dflashx.plan.explain import Term, explained
from dflashx.plan.expr import Expr, const, maximum, minimum, named, scoped, var
from dflashx.resolve.model import ResolvedRecipe


@dataclass(frozen=True)
class Serving:
    """How the target is served, as planned."""

    tp: int
    dp: int
    weight_dtype: str
    kv_elem_bytes: int
    weight_bytes: float  # whole model, one replica
    pool_bytes: float | None  # KV + state pool of one replica; None on the CPU
    per_seq_bytes: float  # KV at the mean running context + state, one sequence
    batch: int
    binding: str
    calibration: float
    calibrated: bool


@dataclass(frozen=True)
class Generation:
    serving: Serving
    tokens_per_second: float
    seconds: float
    terms: tuple[Term, ...]
    speculation: "Speculation | None" = None


def _serving(recipe: ResolvedRecipe, b: Batch) -> Serving:
    s, facts = recipe.stages.generate.serving, recipe.target.facts
    calibration, calibrated = factor(recipe.hardware, CALIBRATED_SERVING, 1.0)
    per_seq = facts.kv_bytes_per_token(b.kv_elem_bytes) * b.mean_context + facts.recurrent_state_bytes
    return Serving(s.tp, s.dp, s.weight_dtype, b.kv_elem_bytes, b.weight_bytes, b.pool_bytes, per_seq, b.value,
                   b.binding, calibration, calibrated)


@dataclass(frozen=True)
class Speculation:
    """Generation with its draft (the MTP head or a DFlash drafter) against without it, at each one's own running
    batch."""

    draft: GenerationDraft
    spec: Rate
    plain: Rate
    spec_batch: Batch
    plain_batch: Batch

    @property
    def pays(self) -> bool:
        return pays(self.spec, self.plain)


def _speculation(recipe: ResolvedRecipe, dev: Device, lengths: Lengths, tokens: Tokens, row: EngineRow,
                 draft: GenerationDraft) -> Speculation:
    plain_b = running_batch_with(recipe, lengths, None)
    spec_b = running_batch(recipe, lengths)
    out, prompt = tokens.output_mean, tokens.prompt_mean
    return Speculation(draft, replica_rate(recipe, dev, spec_b, row, out, prompt, draft.drafter, draft.acceptance),
                       replica_rate(recipe, dev, plain_b, row, out, prompt), spec_b, plain_b)


def _speculation_term(sp: Speculation, recipe: ResolvedRecipe, dp: int, calibration: float) -> Term:
    assert sp.spec.verify is not None and sp.spec.draft is not None, "a speculative rate has both steps"

    def rate(r: Rate) -> float:
        return _throughput(dp, r, calibration).value

    verdict = ("pays" if sp.pays else "does not pay") + f" at batch {sp.spec_batch.value}"
    ratio = var("tokens_per_second_mtp", rate(sp.spec)) / var("tokens_per_second_plain", rate(sp.plain))
    return explained("generate.speculation", ratio, "x",
                     f"tokens/s with {sp.draft.name} over without it, each at its own running batch "
                     "(generate.tokens_per_second); tau = 1 + the acceptance shares of the drafted positions",
                     verdict=verdict, draft=sp.draft.name, batch_mtp=sp.spec_batch.value,
                     batch_plain=sp.plain_batch.value, binding_mtp=sp.spec_batch.binding, tau=sp.spec.tau,
                     acceptance=list(sp.draft.acceptance), acceptance_source=sp.draft.acceptance_source,
                     verify_s=sp.spec.verify.seconds, draft_s=sp.spec.draft.seconds,
                     draft_forwards=sp.draft.drafter.forwards, cycle_s=sp.spec.step_seconds,
                     plain_step_s=sp.plain.step_seconds, flags=generation_draft_text(recipe, mtp_on(recipe)))


def _throughput(dp: int, rate: Rate, calibration: float) -> Expr:
    """dp replicas at one replica's rate (speculative.replica_rate's expression), times the calibration."""
    return var("dp", dp) * named("replica_tokens_per_s", rate.throughput) * var("calibration", calibration)


def _output_left(recipe: ResolvedRecipe, tokens: Tokens) -> Expr:
    """The output tokens the generate stage still has to produce: every sample's, less those of the completions
    the run already holds (`dataset.stats.generated`: the pilot's, which the stage resumes after)."""
    done = min(recipe.dataset.stats.generated, tokens.samples)
    if not done:
        return var("output_tokens", tokens.output)
    return named("output_tokens", (var("samples", tokens.samples) - var("generated", done))
                 * var("output_tokens_mean", tokens.output_mean))


def estimate_generation(recipe: ResolvedRecipe, tokens: Tokens, lengths: Lengths) -> Generation:
    facts, dev = recipe.target.facts, device_of(recipe.hardware)
    gen = recipe.stages.generate
    row = engine_row(gen.serving.mode, gen.backend, recipe.hardware.gpu is not None, facts.num_linear_layers > 0)
    draft = generation_draft(recipe)
    sp = _speculation(recipe, dev, lengths, tokens, row, draft) if draft else None
    b = sp.spec_batch if sp else running_batch(recipe, lengths)
    s = _serving(recipe, b)
    rate = sp.spec if sp else replica_rate(recipe, dev, b, row, tokens.output_mean, tokens.prompt_mean)
    throughput = _throughput(s.dp, rate, s.calibration)
    tps = throughput.value
    seconds_expr = (_output_left(recipe, tokens) / var("tokens_per_second", tps)) if tokens.output else const(0.0)
    seconds = seconds_expr.value
    terms = [
        explained("generate.batch", maximum(minimum(*(var(k, v) for k, v in b.caps.items())), 1),
                  "sequences/replica", "SGLang 0.5.23 mem_cache/kv_cache_configurator.py (docs/planner.md): "
                  "state_pool = state slots / (5 + verified tokens with a draft), kv_pool = KV tokens / mean context",
                  binding=b.binding, caps=b.caps, pool_bytes=b.pool_bytes, mean_context=b.mean_context,
                  kv_bytes_per_token=facts.kv_bytes_per_token(s.kv_elem_bytes),
                  recurrent_state_bytes=facts.recurrent_state_bytes),
        _step_term(recipe, rate, dev, row, b, sp.draft.drafter.forwards if sp else None),
        _prefill_term(rate, tokens.prompt_mean, sp is not None),
        explained("generate.tokens_per_second", throughput, "tokens/s", calibrated=s.calibrated, tau=rate.tau,
                  calibration_source=("measured (hardware.calibrated.serving_ratio)" if s.calibrated
                                      else "none: predicted from facts and engine measurements")),
        explained("generate.seconds", seconds_expr, "s",
                  mtp=(f"on ({sp.draft.name}): see generate.speculation" if sp else "off (target.mtp false, or no "
                       "MTP layer / no server on GPUs; no stages.generate.serving.drafter)")),
    ]
    if sp:
        terms.append(_speculation_term(sp, recipe, s.dp, s.calibration))
    return Generation(s, tps, seconds, tuple(terms), sp)


def _prefill_term(rate: Rate, prompt: float, mtp: bool) -> Term:
    """The prefill (time to first token) and its parts (prefill.py)."""
    p = rate.prefill
    return explained("generate.prefill_seconds", p.time + var("allreduce_s", rate.prefill_allreduce_s), "s",
                     "prefill.py: weight_gemm_s: 2 x active parameters but routed experts x prompt at the served "
                     "precision's GEMM ceiling; draft_gemm_s: a draft's own pass over the prompt"
                     + (" (the MTP layer's)" if mtp else "") + "; attention_s: 4 x heads x head_dim x causal pairs "
                     "per attention layer at the 16-bit ceiling; moe_layer_s: moe.py at the prompt's tokens (an MoE "
                     "MTP head's experts at 16 bits); mixer_s: SGLang on a GPU, transformers' measured rest per "
                     "layer x prompt x mixer factor x bandwidth(H200) / (bandwidth x tp); allreduce_s: TP",
                     prompt_tokens=prompt, moe_layers=p.moe_layers,
                     moe_layer=p.moe.inputs() if p.moe else None, draft_moe_layers=p.draft_moe_layers,
                     draft_moe_layer=p.draft_moe.inputs() if p.draft_moe else None,
                     mixer=({"transformers_rest_s": p.mixer_rest_s, **mixer_factor().inputs(),
                             "gpu_rule": "scaled by the datasheet memory-bandwidth ratio to the H200 (docs/planner.md)"}
                            if p.mixer_rest_s else None))


def _step_term(recipe: ResolvedRecipe, rate: Rate, dev: Device, row: EngineRow, b: Batch,
               forwards: int | None) -> Term:
    """The decode step (or, with a draft making `forwards` forwards a cycle, the draft-verify cycle) and how its
    time splits."""
    speculative = forwards is not None
    step = rate.verify if speculative else target_step(recipe, dev, b, row)
    assert step is not None, "a speculative rate has its verify step"
    s = recipe.stages.generate.serving
    time = step.time
    if speculative:
        assert rate.draft is not None, "a speculative rate has its draft step"
        time = named("verify_s", scoped("verify.", step.time)) + var("draft_forwards", forwards) \
            * named("draft_s", scoped("draft.", rate.draft.time))
    return explained("generate.step_seconds", time, "s",
                     "decode.py: each part (weights, attention over the KV cache, linear-attention states) at its "
                     "own roofline, max(bytes / (bandwidth x tp x copy share), FLOPs / (peak x tp x GEMM share)); "
                     "overhead_s: the 16-bit roofline x (1 / decode share - 1); moe_layer_s: moe.py (grouped GEMMs "
                     "at the rows per expert, kernel floors, token movement)"
                     + ("; verify: the target over num_draft_tokens per sequence" if speculative else ""),
                     step_bytes=step.served.bytes, memory_s=step.served.memory_s, compute_s=step.served.compute_s,
                     overhead_s=step.overhead_s, allreduce_s=step.allreduce_s, bound=step.served.bound,
                     moe_s=step.moe_s, moe_layers=step.moe_layers, moe_layer=step.moe.inputs() if step.moe else None,
                     bandwidth_bps=dev.bandwidth_bps, peak_flops=step.served.peak, tp=s.tp,
                     copy_share=COPY_BANDWIDTH.value, gemm_share=step.served.gemm, decode_share=row.decode.value,
                     decode_share_source=f"{row.decode.source}: {row.decode.figure}",
                     overhead_note="the share was measured with 16-bit weights; FP8 does not shorten what it stands "
                                   "for")
