"""Per-GPU memory of online training, one function per term: the pure pieces resolve decides with
(shard the target? how many sequences per micro step?) and the planner reports
(`dflashx.plan.estimates.memory.training_memory`).

Drafter model states: DeepSpeed's own ZeRO estimates (`estimate_zero2_model_states_mem_needs`,
`estimate_zero3_model_states_mem_needs`, no offload): with bf16 mixed precision every trainable
parameter costs 2 (bf16 weights) + 18 bytes (2 bf16 + 4 fp32 gradients, 4 fp32 master weights,
8 Adam moments), and stage s partitions them over the Nd data-parallel ranks
(Rajbhandari et al. 2020, "ZeRO", sec. 5):
  stage 0: 20 P     stage 1: 4 P + 16 P / Nd     stage 2: 2 P + 18 P / Nd
  stage 3: 4 x largest layer + 18 P / Nd
Activations follow Korthikanti et al. 2022 (34 x hidden bytes per token per layer with flash
attention), plus the drafter logits in fp32 and the captured target hidden states.
Target weights (frozen, at its load precision): a whole copy per GPU (`target_sharding: none`), or
partitioned with ZeRO-3 over the node's N ranks (`zero3`): 1/N of them per rank plus the gather
working set, the unit being computed and the next one, prefetched (ZeRO-3 all-gathers a module's
parameters just before its forward and prefetches the following ones, DeepSpeed's
`stage3_prefetch_bucket_size`; Rajbhandari et al. 2020, sec. 5.3), a unit being one decoder
layer (all its experts: transformers holds them in one fused tensor) or the embedding / LM head.
"""

from __future__ import annotations

from dflashx.config.fields import PRECISION_BYTES
from dflashx.resolve.flops import DrafterDims
from dflashx.targets.registry import TargetFacts

GATHER_UNITS = 2  # gathered at once under ZeRO-3: the unit computing and the one prefetched


def activation_bytes(dtype: str) -> int:
    """Bytes of one activation element: fp32 stays fp32, everything else computes in 16 bits."""
    return 4 if dtype == "fp32" else 2


def zero_model_state_bytes(params: float, stage: int, ranks: int, largest_layer: float = 0.0) -> float:
    """DeepSpeed ZeRO model-state bytes per rank for `params` trainable parameters (no offload)."""
    n = max(ranks, 1)
    return {
        0: 20 * params,
        1: 4 * params + 16 * params / n,
        2: 2 * params + 18 * params / n,
        3: 4 * largest_layer + 18 * params / n,
    }[stage]


def sample_activation_bytes(facts: TargetFacts, drafter: DrafterDims, precision: str, length: float,
                            drafter_tokens: float) -> float:
    """One training sample's activations: the drafter's layers over its block tokens, its fp32
    logits, and the k captured target hidden states over the sample's `length` tokens."""
    act = activation_bytes(precision)
    drafter_act = 34 / 2 * act * facts.hidden_size * drafter_tokens * drafter.num_layers
    logits = 4 * facts.vocab_size * drafter_tokens
    captured = drafter.k * length * facts.hidden_size * act
    return drafter_act + logits + captured


def largest_gather_bytes(facts: TargetFacts, load_precision: str) -> float:
    """The largest unit ZeRO-3 gathers whole: a decoder layer, or the embedding / LM head matrix."""
    layer = max(facts.layer_params(i) for i in range(facts.num_layers))
    return max(layer, facts.vocab_size * facts.hidden_size) * PRECISION_BYTES[load_precision]


def target_weight_bytes(facts: TargetFacts, load_precision: str, sharding: str, ranks: int) -> float:
    """The frozen target's weights per GPU: a whole copy, or (zero3) 1/N plus the gather working set plus
    the whole input embedding and LM head every rank keeps beside the partition: the drafter reads them
    outside the target's forward (`dflashx.dflash.target_shard.frozen_io`)."""
    width = PRECISION_BYTES[load_precision]
    whole = facts.total_params * width
    if sharding != "zero3":
        return whole
    io_copies = facts.vocab_size * facts.hidden_size * (1 if facts.tie_word_embeddings else 2) * width
    return whole / max(ranks, 1) + GATHER_UNITS * largest_gather_bytes(facts, load_precision) + io_copies


def train_memory_parts(facts: TargetFacts, drafter: DrafterDims, *, online: bool, load_precision: str,
                       precision: str, sharding: str, ranks: int, zero_stage: int, micro_batch: int,
                       length: float, drafter_tokens: float) -> dict[str, float]:
    """Per-GPU training memory by part (the planner's `train.peak_memory` and resolve's decisions)."""
    return {
        "target_weights": target_weight_bytes(facts, load_precision, sharding, ranks) if online else 0.0,
        "drafter_model_states": zero_model_state_bytes(drafter.trainable, zero_stage, ranks, drafter.layer_params),
        "activations": micro_batch * sample_activation_bytes(facts, drafter, precision, length, drafter_tokens),
    }
