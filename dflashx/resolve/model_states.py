"""The drafter's model states under DeepSpeed: bytes per trainable parameter, then per rank.

Counted from what DeepSpeed 0.19 allocates (no offload), one term per tensor family:
  weights       the module's parameters, in the drafter's precision w (`stages.train.precision`:
                2 bytes bf16, 4 fp32);
  gradients     the reduced gradients, in w;
  master        the optimizer's copy of the weights in the master dtype m (fp32, or bf16 with
                `stages.train.master_weights: bf16` — `bf16_master_weights_and_grads`), plus its
                gradient converted to m when m differs from w. ZeRO 1/2 always keep the flat master
                partition (`single_partition_of_fp32_groups`, runtime/zero/stage_1_and_2.py); at
                ZeRO 0 the optimizer steps the module's own parameters when m == w (no copy);
  optimizer     AdamW: two moments in m (`bf16_optimizer_states` with bf16 master, else fp32).
                Muon (the drafter's weight matrices, which DeepSpeed tags `use_muon`): one momentum
                buffer; under ZeRO 1/2 it follows the gradient's dtype w and a staged copy of it is
                kept beside it (`_muon_momentum_buffer`, `_muon_staging_momentum`,
                stage_1_and_2.py); at ZeRO 0 it is `zeros_like` the stepped parameter (m;
                runtime/zero/muon/muon_optimizer.py).
Under Muon the rest of the drafter (norm vectors; DFlash2's base kernels and its two V x r codebooks,
embedding tables Muon does not orthogonalise) is stepped by DeepSpeed's auxiliary AdamW and so holds
AdamW's bytes: `model_state_bytes` counts the two groups apart (`DrafterDims.adamw_params`). For
DFlash2 on Qwen3.6 the codebooks are 127M of those parameters (2 x 248,320 x 256).
bf16 weights, fp32 master and AdamW give 2 + 2 + (4 + 4) + 8 = 20 bytes, DeepSpeed's own estimate
(`estimate_zero2_model_states_mem_needs`: 2 P + 18 P / N); bf16 master weights give 2 + 2 + 2 + 4
= 10. `drafter.precision: fp8` changes none of these: torchao's float8 training casts the matmul
inputs per step and keeps the weights (and so every state) in bf16.

ZeRO stage s partitions over the N data-parallel ranks (Rajbhandari et al. 2020, "ZeRO", sec. 5):
stage 1 the master and optimizer states, stage 2 the gradients as well (the drafter never runs
ZeRO 3: `stages.train.zero_stage` is 0, 1 or 2). A Muon matrix that
straddles a partition boundary is held whole by each rank it touches (`muon_copy_ranks`,
stage_1_and_2.py): at most one matrix per boundary more, left out here.
tests/test_model_states.py builds the real engine on CPU for each case and compares what it holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.config.fields import PRECISION_BYTES


@dataclass(frozen=True)
class StateBytes:
    """Bytes per trainable parameter of each tensor family, before any partitioning."""

    weights: float
    gradients: float
    master: float  # the master copy of the weights (0 when the optimizer steps the weights themselves)
    master_gradients: float  # the gradient converted to the master dtype (0 when it is already in it)
    optimizer: float

    @property
    def persistent(self) -> float:
        """What lives between steps: weights, master copy, optimizer states (gradients are freed)."""
        return self.weights + self.master + self.optimizer

    @property
    def total(self) -> float:
        return self.persistent + self.gradients + self.master_gradients


def state_bytes(precision: str, master_weights: str, optimizer: str, zero_stage: int) -> StateBytes:
    """Bytes per drafter parameter for the resolved train precision, `master_weights`, optimizer
    and ZeRO stage (see the module doc for where each term comes from)."""
    w = PRECISION_BYTES[precision]
    m = PRECISION_BYTES["bf16"] if master_weights == "bf16" and precision == "bf16" else PRECISION_BYTES["fp32"]
    zero = zero_stage >= 1
    master = m if zero or m != w else 0
    # Muon: one momentum (w, and a staged copy, under ZeRO 1/2; m at ZeRO 0); AdamW: two moments in m
    states = (2 * w if zero else m) if optimizer == "muon" else 2 * m
    return StateBytes(weights=w, gradients=w, master=master, master_gradients=m if m != w else 0, optimizer=states)


def zero_model_state_bytes(params: float, stage: int, ranks: int, per_param: StateBytes) -> float:
    """Model-state bytes per rank for `params` trainable parameters at ZeRO `stage` over `ranks`."""
    n = max(ranks, 1)
    b = per_param
    optimizer_side = b.master + b.master_gradients + b.optimizer
    full, parted = {
        0: (b.weights + b.gradients + optimizer_side, 0.0),
        1: (b.weights + b.gradients, optimizer_side),
        2: (b.weights, b.gradients + optimizer_side),
    }[stage]
    return full * params + parted * params / n


def model_state_bytes(params: float, adamw_params: float, precision: str, master_weights: str, optimizer: str,
                      zero_stage: int, ranks: int) -> float:
    """Model-state bytes per rank of a drafter of `params` parameters, `adamw_params` of which an optimizer
    of `optimizer` leaves to AdamW (all of them are AdamW's when `optimizer` is adamw; module doc)."""
    main = state_bytes(precision, master_weights, optimizer, zero_stage)
    aux = state_bytes(precision, master_weights, "adamw", zero_stage)
    rest = adamw_params if optimizer == "muon" else 0.0
    return (zero_model_state_bytes(params - rest, zero_stage, ranks, main)
            + zero_model_state_bytes(rest, zero_stage, ranks, aux))
