"""The running batch of one replica: SGLang's own pool sizing, and the one function that decides it.

`running_batch` is read by the plan (the decode estimate) and, through `client_in_flight`, by the
launch plan (each server's `in_flight`) and so by the generate stage's client: the client keeps open
per replica exactly the requests the estimate assumed (`stages.generate.concurrency`, its "client"
cap, when set; else the planned batch).

SGLang 0.5.23 sizes a replica's memory as (python/sglang/srt/mem_cache/kv_cache_configurator.py,
`_profile_available_bytes`, `_handle_max_mamba_cache`, `resolve_max_num_reqs`):
  rest    = tp x GPU memory x mem_fraction_static - weights
  hybrid targets (linear-attention layers): the state pool takes rest x r / (1 + r), with
          r = --mamba-full-memory-ratio (default 0.9, arg_groups/fields/schedule.py); its slots
          = pool / state bytes per sequence, and each running request holds 5 of them (3, plus 2
          tracking slots of the default `extra_buffer` radix-cache strategy with the overlap
          scheduler: MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO and allocation_sizing.py);
  KV      = what is left, in tokens of KV bytes/token.
With speculative decoding (`SpecMemory`) the draft's own weights come off `rest` first, its KV is added
to each token's, and every running request holds one more state per verified token.
The batch is the smallest of: the client's in-flight count (`stages.generate.concurrency`, else
no cap), --max-running-requests, the state slots / 5, and KV tokens / the mean context of a
running sequence. With continuous batching the running sequences are length-biased: their mean
context is prompt + E[O_c^2] / (2 E[O_c]), O_c = min(O, max_tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.plan.estimates.lengths import Lengths
from dflashx.resolve.model import ResolvedGenerateStage, ResolvedRecipe
from dflashx.resolve.serving import kv_elem_bytes, served_weight_bytes

MAMBA_FULL_MEMORY_RATIO = 0.9
STATE_SLOTS_PER_REQUEST = 5
HICACHE_RATIO = 2.0  # --hicache-ratio default: host pool = 2 x the device pool (arg_groups/fields/memory.py)
NO_CAP = 1 << 20


@dataclass(frozen=True)
class SpecMemory:
    """What speculative decoding adds to a replica's memory: the draft's weights (outside the served
    checkpoint), its own KV per context token, and the linear-attention states SGLang keeps per running
    request for each verified token (`intermediate_ssm_state_cache`, mem_cache/memory_pool.py)."""

    draft_weight_bytes: float
    kv_bytes_per_token: float
    verify_tokens: int


def mtp_on(recipe: ResolvedRecipe) -> bool:
    """The generation servers run the target's MTP head: asked for, shipped, SGLang or vLLM on GPUs."""
    return bool(recipe.target.mtp and recipe.target.facts.mtp_layers
                and recipe.stages.generate.serving.mode != "in-process" and recipe.hardware.gpu is not None)


def drafter_on(recipe: ResolvedRecipe) -> bool:
    """The generation servers draft with a DFlash drafter folder (`stages.generate.serving.drafter`)."""
    return bool(recipe.stages.generate.serving.drafter) and recipe.stages.generate.serving.mode != "in-process"


def mtp_memory(recipe: ResolvedRecipe) -> SpecMemory | None:
    """The MTP head's memory when generation runs it: its weights are in the checkpoint (served already),
    its full-attention layers keep KV, and each running request holds num_draft_tokens extra states."""
    if not mtp_on(recipe):
        return None
    s, facts = recipe.stages.generate.serving, recipe.target.facts
    kv = kv_elem_bytes(s.kv_cache_dtype, s.weight_dtype)
    per_token = 2 * facts.mtp_layers * facts.num_kv_heads * facts.head_dim * kv
    return SpecMemory(0.0, per_token, s.speculative.num_draft_tokens)


def drafter_memory(recipe: ResolvedRecipe) -> SpecMemory | None:
    """A generation drafter's memory: its weights (outside the served checkpoint) and KV in 16 bits, and the
    verified block per running request (`speculative.dflash_drafter` counts the same)."""
    if not drafter_on(recipe):
        return None
    d = recipe.drafter.dims
    kv_per_token = d.num_layers * 2 * d.num_key_value_heads * d.head_dim * 2
    return SpecMemory(d.trainable * 2, kv_per_token, recipe.drafter.block_size)


def spec_memory(recipe: ResolvedRecipe) -> SpecMemory | None:
    """What the generation servers' draft adds to their memory: the MTP head's, a DFlash drafter's, or none."""
    return mtp_memory(recipe) or drafter_memory(recipe)


@dataclass(frozen=True)
class Batch:
    """The running batch of one replica, what binds it, and every cap."""

    value: int
    binding: str  # which cap binds: client, max_running_requests, state_pool, kv_pool, batch_size
    caps: dict[str, int]
    pool_bytes: float | None  # KV + state pool of one replica (None: not an SGLang GPU replica)
    weight_bytes: float
    kv_elem_bytes: int
    mean_context: float


def client_in_flight(gen: ResolvedGenerateStage, batch: int) -> int:
    """Requests the generate client keeps open per replica: `stages.generate.concurrency` when set (the
    estimate's "client" cap, so the planned batch never exceeds it), else the planned running batch
    (at least 1). The launch plan and so the runtime read this one number."""
    return gen.concurrency or max(batch, 1)


def mean_running_context(prompt_mean: float, lengths: Lengths, max_tokens: int) -> float:
    """prompt + E[O_c^2] / (2 E[O_c]): the mean context of a sequence being decoded."""
    first = lengths.clipped_moment(1, max_tokens)
    return prompt_mean + (lengths.clipped_moment(2, max_tokens) / (2 * first) if first else 0.0)


def running_batch(recipe: ResolvedRecipe, lengths: Lengths) -> Batch:
    """The batch the generation servers decode, with their draft's memory when they draft."""
    return running_batch_with(recipe, lengths, spec_memory(recipe))


def running_batch_with(recipe: ResolvedRecipe, lengths: Lengths, spec: SpecMemory | None) -> Batch:
    """The batch one replica decodes (module doc), with `spec`'s memory taken first; on the CPU /
    transformers: `batch_size`."""
    gen, hw = recipe.stages.generate, recipe.hardware
    s, facts = gen.serving, recipe.target.facts
    kv = kv_elem_bytes(s.kv_cache_dtype, s.weight_dtype)
    weights = served_weight_bytes(facts, s.weight_dtype)
    context = mean_running_context(recipe.dataset.stats.prompt_tokens_mean, lengths, gen.max_tokens)
    if s.mode == "in-process" or hw.gpu is None:
        caps = {"batch_size": gen.batch_size}
        return Batch(gen.batch_size, "batch_size", caps, None, weights, kv, context)
    draft_weights, draft_kv, held = (spec.draft_weight_bytes, spec.kv_bytes_per_token, spec.verify_tokens) \
        if spec else (0.0, 0.0, 0)
    rest = s.tp * hw.gpu.memory_gb * 1e9 * s.mem_fraction_static - weights - draft_weights
    caps = {"client": gen.concurrency or NO_CAP, "max_running_requests": s.max_running_requests}
    kv_bytes = rest
    state = facts.recurrent_state_bytes
    if state:
        slots = int(max(rest, 0) * MAMBA_FULL_MEMORY_RATIO / (1 + MAMBA_FULL_MEMORY_RATIO) // state) - 1
        caps["state_pool"] = max(slots, 0) // (STATE_SLOTS_PER_REQUEST + held)
        kv_bytes = rest - (max(slots, 0) + 1) * state
    caps["kv_pool"] = int(max(kv_bytes, 0) / ((facts.kv_bytes_per_token(kv) + draft_kv) * context))
    binding = min(caps, key=lambda k: caps[k])
    return Batch(max(caps[binding], 0), binding, caps, rest, weights, kv, context)


def hicache_host_bytes(batch: Batch) -> float:
    """Host memory one server's hierarchical cache takes: --hicache-ratio x its device pool."""
    return HICACHE_RATIO * max(batch.pool_bytes or 0.0, 0.0)
