"""The generate stage's serving settings, derived once: one pure function per `auto` value.

  mode            spawn | attach | in-process: the transformers backend runs in-process, SGLang and vLLM
                  attach to stages.generate.urls when given, else dflashx launches their servers (every rule,
                  estimate, the launch plan, the preflight and the pilot read this one value)
  weight_dtype    target.precision (a reviewed recipe says what runs: FP8 serving changes the data)
  checkpoint      the recipe's, else target.model; FP8 weights from a checkpoint that is not an FP8
                  one are quantized online (--quantization fp8)
  tp, dp          1 and 1 without a GPU (one process on the CPU, whatever the recipe says); else
  tp              the smallest of 1, 2, 4, ... (dividing the GPUs per node) whose memory
                  (tp x GPU memory x mem_fraction_static) holds the served weights and one
                  full-length sequence (prompt mean + max_tokens of KV, plus the linear-attention state)
  dp              the profile's GPUs / tp
  dp_mode         router without NVLink-class links (interconnect_gbs < 100 GB/s) or over several
                  nodes, else one server with --dp-size per node
  context_length  the target's native context (SGLang's own default), so no prompt is refused
                  for length unless prompt + max_tokens exceeds what the model supports
docs/planner.md ("Derived values") lists them.
"""

from __future__ import annotations

from dflashx.config.fields import PRECISION_BYTES
from dflashx.config.schema import HardwareProfile, Recipe
from dflashx.resolve.model import ResolvedServing, ResolvedSpeculative, ServingMode
from dflashx.resolve.speculative import MTP_QWEN36, expected_drafter_acceptance, mtp_acceptance, tau_source
from dflashx.targets.registry import TargetFacts
from dflashx.targets.target_facts import WEIGHT_FORMAT_BITS

NVLINK_CLASS_GBS = 100.0
KV_ELEM_BYTES = {"bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}  # SGLang --kv-cache-dtype, bytes per element


def kv_elem_bytes(kv_cache_dtype: str, weight_dtype: str) -> int:
    """Bytes of one KV element: the named dtype, or (auto) the weights' compute dtype."""
    if kv_cache_dtype in KV_ELEM_BYTES:
        return KV_ELEM_BYTES[kv_cache_dtype]
    return 4 if weight_dtype == "fp32" else 2


def expert_elem_bytes(facts: TargetFacts, weight_dtype: str) -> float:
    """Bytes per routed-expert weight as served: the checkpoint's own expert format when it is the
    narrower one (gpt-oss's MXFP4 experts, which SGLang serves as published), else `weight_dtype`."""
    served = PRECISION_BYTES[weight_dtype]
    if facts.expert_weight_format is None:
        return served
    return min(served, WEIGHT_FORMAT_BITS[facts.expert_weight_format] / 8)


def served_weight_bytes(facts: TargetFacts, weight_dtype: str) -> float:
    """Bytes the servers hold: decoder-layer weights at `weight_dtype` (routed experts at
    `expert_elem_bytes`); embeddings, LM head and the rest of the checkpoint (vision tower, MTP
    layer) stay 16-bit (32-bit for fp32), as the FP8 checkpoints ship them."""
    decoder = facts.params_through_layer(facts.num_layers - 1)
    rest = max(facts.total_params - decoder, 0)
    experts = facts.routed_expert_params
    return ((decoder - experts) * PRECISION_BYTES[weight_dtype] + experts * expert_elem_bytes(facts, weight_dtype)
            + rest * (4 if weight_dtype == "fp32" else 2))


def one_sequence_bytes(facts: TargetFacts, kv_bytes: float, context: float) -> float:
    """KV of `context` tokens plus the fixed linear-attention state of one sequence."""
    return facts.kv_bytes_per_token(kv_bytes) * context + facts.recurrent_state_bytes


def weight_dtype(recipe: Recipe) -> str:
    chosen = recipe.stages.generate.serving.weight_dtype
    return recipe.target.precision if chosen == "auto" else chosen


def checkpoint(recipe: Recipe) -> str:
    return recipe.stages.generate.serving.checkpoint or recipe.target.model


def online_quantization(recipe: Recipe) -> bool:
    """FP8 weights without a named (FP8) checkpoint: SGLang quantizes the BF16 one while loading."""
    return weight_dtype(recipe) == "fp8" and recipe.stages.generate.serving.checkpoint is None \
        and recipe.target.precision != "fp8"


def serving_mode(recipe: Recipe) -> ServingMode:
    """Who runs the target for generation (module doc): decided here only."""
    gen = recipe.stages.generate
    if gen.backend == "transformers":
        return "in-process"
    return "attach" if gen.urls else "spawn"


def tensor_parallel(recipe: Recipe, facts: TargetFacts) -> int:
    """1 without a GPU; the recipe's tp, else the smallest power of two dividing the node that fits (module doc)."""
    serving, hw = recipe.stages.generate.serving, recipe.hardware
    if hw.gpu is None:
        return 1
    if serving.tp != "auto":
        return serving.tp
    if hw.gpus_per_node <= 1:
        return 1
    wd = weight_dtype(recipe)
    need_seq = one_sequence_bytes(facts, kv_elem_bytes(serving.kv_cache_dtype, wd),
                                  recipe.dataset.stats.prompt_tokens_mean + recipe.stages.generate.max_tokens)
    weights = served_weight_bytes(facts, wd)
    tp = 1
    while tp < hw.gpus_per_node:
        if tp * hw.gpu.memory_gb * 1e9 * serving.mem_fraction_static - weights >= need_seq:
            return tp
        if hw.gpus_per_node % (tp * 2):
            break
        tp *= 2
    return tp


def data_parallel(recipe: Recipe, tp: int) -> int:
    dp = recipe.stages.generate.serving.dp
    if recipe.hardware.gpu is None:
        return 1
    if dp != "auto":
        return dp
    return max(recipe.hardware.num_gpus // tp, 1)


def dp_mode(hw: HardwareProfile, chosen: str) -> str:
    if chosen != "auto":
        return chosen
    nvlink = hw.interconnect_gbs is not None and hw.interconnect_gbs >= NVLINK_CLASS_GBS
    return "dp_size" if nvlink and hw.nodes == 1 else "router"


def context_length(recipe: Recipe, facts: TargetFacts) -> int:
    return recipe.stages.generate.context_length or facts.max_position_embeddings


def speculative(recipe: Recipe) -> ResolvedSpeculative:
    """The generation draft's acceptance profile: the recipe's, else for a DFlash drafter folder
    (`serving.drafter`) the expected drafter acceptance (as `deploy` resolves it), else the MTP head's
    published profile."""
    spec = recipe.stages.generate.serving.speculative
    if recipe.stages.generate.serving.drafter:
        drafts = recipe.drafter.block_size - 1
        acceptance = ((list(spec.acceptance) + [0.0] * drafts)[:drafts] if spec.acceptance
                      else expected_drafter_acceptance(recipe))
        source = ("stages.generate.serving.speculative.acceptance (the recipe)" if spec.acceptance
                  else f"the expected drafter acceptance: {tau_source(recipe)}")
        return ResolvedSpeculative(**{**spec.model_dump(), "acceptance": acceptance, "acceptance_source": source})
    source = ("stages.generate.serving.speculative.acceptance (the recipe)" if spec.acceptance else
              f"{MTP_QWEN36.source}: {MTP_QWEN36.figure} ({MTP_QWEN36.conditions})")
    return ResolvedSpeculative(**{**spec.model_dump(), "acceptance": mtp_acceptance(recipe),
                                  "acceptance_source": source})


def resolve_serving(recipe: Recipe, facts: TargetFacts) -> ResolvedServing:
    serving = recipe.stages.generate.serving
    tp = tensor_parallel(recipe, facts)
    return ResolvedServing(**{
        **serving.model_dump(),
        "speculative": speculative(recipe),
        "mode": serving_mode(recipe),
        "tp": tp,
        "dp": data_parallel(recipe, tp),
        "dp_mode": dp_mode(recipe.hardware, serving.dp_mode),
        "weight_dtype": weight_dtype(recipe),
        "checkpoint": checkpoint(recipe),
        "online_quantization": online_quantization(recipe),
    })
