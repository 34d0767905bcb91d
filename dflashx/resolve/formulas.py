"""The DFlash formulas every part of dflashx shares: one function each, pure arithmetic.

- `spread_layer_ids(N, k)`: the target layers the drafter taps (DFlash paper, arXiv 2602.06036,
  and the z-lab reference `build_target_layer_ids`): k == 1 -> [N // 2]; else
  round(1 + i * (N - 4) / (k - 1)) for i < k, with Python's round (half to even) as the reference
  uses it. Where 1..N-3 holds fewer than k layers (tiny targets) the spread widens to 0..N-1.
  Layer id l means the output of decoder layer l (HF `hidden_states[l + 1]`).
- `loss_gamma(B)`: the slot-decay constant, the paper's 7 / 5 / 4 for B = 16 / 10 / 8, linear
  between those points and along the end slopes beyond them, at least 1.
- `lr_factor(schedule, step, total, warmup)`: the learning-rate factor of the trainer's schedule.
- `effective_batch`, `steps_per_epoch`, `optimizer_steps`: the trainer's batch arithmetic, which the
  planner's step count and time use on the samples it expects.
- `min_loss_tokens(blocks, block_size)`: the fewest loss tokens a sample keeps (tokenize's drop rule).
"""

from __future__ import annotations

import math

_GAMMA_POINTS = ((8, 4.0), (10, 5.0), (16, 7.0))


def spread_layer_ids(num_layers: int, k: int) -> list[int]:
    """k target layer ids spread over a target of `num_layers` decoder layers (see module doc).

    k > N gives repeated ids, which the plan's layer rule rejects with its fix.
    """
    if k < 1 or num_layers < 1:
        raise ValueError(f"need k >= 1 and N >= 1 layers, got k={k}, N={num_layers}")
    if k == 1:
        return [num_layers // 2]
    lo, hi = 1, num_layers - 3
    if hi - lo + 1 < k:
        lo, hi = 0, num_layers - 1
    return [round(lo + i * (hi - lo) / (k - 1)) for i in range(k)]


def loss_gamma(block_size: int) -> float:
    """Piecewise-linear through (8, 4), (10, 5), (16, 7), extended with the end slopes; at least 1."""
    (b0, g0), (b1, g1), (b2, g2) = _GAMMA_POINTS
    if block_size <= b1:
        value = g0 + (block_size - b0) * (g1 - g0) / (b1 - b0)
    else:
        value = g1 + (block_size - b1) * (g2 - g1) / (b2 - b1)
    return round(max(value, 1.0), 4)


def effective_batch(micro_batch: int, grad_accum: int, world_size: int) -> int:
    """Sequences per optimizer step: micro_batch x grad_accum x ranks (DeepSpeed's train_batch_size;
    above `global_batch` when global_batch is not a multiple of micro_batch x ranks)."""
    return micro_batch * grad_accum * world_size


def steps_per_epoch(rows: int, micro_batch: int, grad_accum: int, world_size: int) -> int:
    """Optimizer steps in one pass over `rows` training rows: each rank's DistributedSampler keeps
    rows // ranks (drop_last), its loader full micro batches, an epoch ends at its last full step."""
    return (rows // world_size) // micro_batch // grad_accum


def optimizer_steps(per_epoch: int, epochs: float, max_steps: int | None) -> int:
    """Optimizer steps of a run: `max_steps` when given, else ceil(epochs x steps per epoch), at least 1."""
    return max_steps if max_steps is not None else max(1, math.ceil(epochs * per_epoch))


def min_loss_tokens(blocks: float, block_size: int) -> int:
    """Fewest loss tokens a tokenized sample keeps: ceil(min_loss_tokens_blocks x block_size)."""
    return math.ceil(blocks * block_size)


def warmup_steps(total_steps: int, warmup_ratio: float) -> int:
    """Optimizer steps of linear warm-up: ceil(ratio x total), at least 1."""
    return max(1, math.ceil(warmup_ratio * total_steps))


# The decay after warm-up, as a function of the share of the decay span done (0 -> 1, 1 -> 0).
DECAYS = {
    "cosine": lambda done: 0.5 * (1.0 + math.cos(math.pi * done)),  # the DFlash paper's
    "linear": lambda done: 1.0 - done,  # speculators' default
}


def lr_factor(schedule: str, step: int, total_steps: int, warmup: int) -> float:
    """The factor of every group's peak learning rate before optimizer step `step` (0-based): linear
    warm-up to 1 over `warmup` steps, then `schedule` (cosine or linear) decay to 0 at `total_steps`."""
    if step < warmup:
        return (step + 1) / warmup
    span = max(total_steps - warmup, 1)
    return DECAYS[schedule](min(step - warmup, span) / span)


# Muon's peak learning rate relative to `lr` when the recipe leaves stages.train.muon_lr unset:
# speculators' default (`muon_lr = 10 x lr`, src/speculators/train/config/schema.py, 0.9.0), in the
# same AdamW-matched units (torch.optim.Muon's `match_rms_adamw`). The ablation's table in
# docs/training.md says how this factor fared on the tiny run.
MUON_LR_FACTOR = 10.0
MUON_RMS = 0.2  # AdamW's typical update RMS the Muon update is scaled to (Liu et al. 2025, Moonlight, eq. 4)


def muon_lr(lr: float, muon_lr_value: float | None) -> float:
    """The Muon matrices' peak learning rate in AdamW-matched units."""
    return muon_lr_value if muon_lr_value is not None else MUON_LR_FACTOR * lr


def muon_engine_lr(matched_lr: float, rows: int, cols: int) -> float:
    """DeepSpeed's Muon learning rate for a [rows, cols] matrix that gives the AdamW-matched rate
    `matched_lr`: DeepSpeed scales an orthogonalised update by sqrt(max(1, rows/cols)) (Keller
    Jordan's Muon); AdamW-matching scales it by 0.2 sqrt(max(rows, cols)) (Moonlight; torch.optim.Muon
    `adjust_lr_fn="match_rms_adamw"`), so the engine's rate is the ratio of the two times `matched_lr`."""
    return matched_lr * MUON_RMS * math.sqrt(max(rows, cols)) / math.sqrt(max(1.0, rows / cols))


def train_precision(on_gpu: bool, target_precision: str) -> str:
    """The drafter's compute and weight precision: bf16 on GPUs, fp32 on a CPU profile or beside an fp32 target."""
    return "bf16" if on_gpu and target_precision != "fp32" else "fp32"
