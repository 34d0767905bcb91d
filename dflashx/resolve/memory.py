"""Per-GPU memory of online training, one function per term: the pure pieces resolve decides with
(shard the target? how many sequences per micro step?) and the planner reports
(`dflashx.plan.estimates.memory.training_memory`).

Drafter model states: bytes per trainable parameter from what DeepSpeed allocates for the resolved
precision, `master_weights`, optimizer and ZeRO stage (`dflashx.resolve.model_states`; under Muon the
norms, base kernels and codebooks at AdamW's bytes), partitioned over the data-parallel ranks.
Activations of one sequence at the longest sample the run can see (a micro batch is padded to its
longest row, and the peak is reached by the longest): L = min(stages.train.max_length,
stages.tokenize.max_length) tokens (tokenize truncates or drops longer ones, the trainer cuts at its
max_length) with n = min(anchors_per_seq, L) anchors, so D = n x B drafter block tokens:
  drafter layers   34 x h bytes per token per layer at 16 bits (Korthikanti et al. 2022, "Reducing
                   Activation Recomputation in Large Transformer Models": s b h (34 + 5 a s / h) per
                   layer, whose attention-score term flash attention never stores), scaled by the
                   element size, x D x layers;
  DFlash2          per layer and block token, each of the two convolutions keeps for its backward
                   the convolved sublayer input and the sublayer's output (h each) and its dynamic
                   kernels (2 K G); its own input is the norm's output, already among the 34; the
                   selector per supervised slot P(h), A[a] * P(h) and the k successor rows (r each) and
                   the k scores, (2 + k) r + k elements;
  logits           fp32 D x V (the LM head's output over the block tokens);
  captured states  the k tapped target layers' hidden states, k x L x h elements.
Target weights (frozen, at its load precision): a whole copy per GPU (`target_sharding: none`), or
partitioned with ZeRO-3 over the node's N ranks (`zero3`): 1/N of them per rank plus the gather
working set, the unit being computed and the next one, prefetched (ZeRO-3 all-gathers a module's
parameters just before its forward and prefetches the following ones, DeepSpeed's
`stage3_prefetch_bucket_size`; Rajbhandari et al. 2020, sec. 5.3), a unit being one decoder
layer (all its experts: transformers holds them in one fused tensor) or the embedding / LM head.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.config.fields import PRECISION_BYTES
from dflashx.resolve.flops import DrafterDims
from dflashx.resolve.model_states import model_state_bytes
from dflashx.targets.registry import TargetFacts

GATHER_UNITS = 2  # gathered at once under ZeRO-3: the unit computing and the one prefetched


def activation_bytes(dtype: str) -> int:
    """Bytes of one activation element: fp32 stays fp32, everything else computes in 16 bits."""
    return 4 if dtype == "fp32" else 2


KORTHIKANTI_BYTES_PER_TOKEN_PER_H = 34  # per layer and hidden unit, 16-bit elements, flash attention


def longest_sample(train_max_length: int, tokenize_max_length: int) -> int:
    """Tokens of the longest training sample: what both tokenize and the trainer let through."""
    return min(train_max_length, tokenize_max_length)


@dataclass(frozen=True)
class SequenceActivations:
    length: int  # tokens of the sample
    drafter_tokens: int  # its block tokens
    drafter_layers: float
    logits: float
    captured: float

    @property
    def total(self) -> float:
        return self.drafter_layers + self.logits + self.captured


def sequence_activations(facts: TargetFacts, drafter: DrafterDims, precision: str, length: int,
                         anchors_per_seq: int, block_size: int) -> SequenceActivations:
    """Activation bytes of one training sequence of `length` tokens (module doc), elements in `precision`."""
    tokens = min(anchors_per_seq, length) * block_size
    element = activation_bytes(precision)
    modules = drafter.modules  # the architecture's (DFlash2: convolutions per token and layer, selector per slot)
    per_token_layer = (KORTHIKANTI_BYTES_PER_TOKEN_PER_H / 2 * element * facts.hidden_size
                       + element * modules.activation_per_token_layer)
    selector = element * modules.activation_per_slot * tokens * (block_size - 1) / block_size
    return SequenceActivations(
        length=length, drafter_tokens=tokens,
        drafter_layers=per_token_layer * tokens * drafter.num_layers + selector,
        logits=4.0 * facts.vocab_size * tokens, captured=float(drafter.k * length * facts.hidden_size * element))


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
                       train_precision: str, master_weights: str, optimizer: str, sharding: str, ranks: int,
                       zero_stage: int, micro_batch: int, sample: SequenceActivations) -> dict[str, float]:
    """Per-GPU training memory by part (the planner's `train.peak_memory` and resolve's decisions)."""
    return {
        "target_weights": target_weight_bytes(facts, load_precision, sharding, ranks) if online else 0.0,
        "drafter_model_states": model_state_bytes(drafter.trainable, drafter.adamw_params, train_precision,
                                                  master_weights, optimizer, zero_stage, ranks),
        "activations": micro_batch * sample.total,
    }
