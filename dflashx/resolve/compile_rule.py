"""When compiling the drafter's layers pays: `stages.train.compile: auto` on a GPU.

torch.compile makes each step cheaper but costs a cold compile before the first compiled step (the drafter's
layers and flex attention, forward and backward; a new machine has no inductor cache). It pays when the steps
left save more than that: remaining steps x eager step seconds x COMPILE_SAVING > COLD_COMPILE_SECONDS. The
train stage measures the eager step on its first steps (`DECIDE_AFTER_STEPS`, the first `WARMUP_STEPS` left
out) and decides once, then; the tiny recipe's 350 steps of ~30 ms never pay for ~20 s of compile, a real
drafter's thousands of steps of ~0.4 s always do.

Public API: `COLD_COMPILE_SECONDS`, `COMPILE_SAVING`, `WARMUP_STEPS`, `DECIDE_AFTER_STEPS`,
`compile_pays(eager_step_seconds, remaining_steps)`.
"""

from __future__ import annotations

# The product trainer at the Qwen3-32B benchmark shape on one H100 with no inductor cache: first compiled call
# 21.7 s, the same call with the cache warm 1.4 s (benchmarks/results/train_step_vs.json, 2026-12-07); the tiny
# recipe's first two compiled steps on an H100 took 21 s in all (issue 38's GPU run).
COLD_COMPILE_SECONDS = 20.3
# Compiled vs eager step, both with the torch loss, Qwen3-32B shape on one H200: 387.95 vs 428.38 ms
# (benchmarks/results/train_step.json, rows "trainer, torch loss" and "trainer eager", commit d97593b).
COMPILE_SAVING = 1 - 387.95 / 428.38
WARMUP_STEPS = 2  # optimizer steps whose time includes first-call work (allocations, cuBLAS and kernel set-up)
DECIDE_AFTER_STEPS = 8  # the eager steps timed before deciding: steps WARMUP_STEPS + 1 .. DECIDE_AFTER_STEPS


def compile_pays(eager_step_seconds: float, remaining_steps: int) -> bool:
    """True when compiling now saves more over `remaining_steps` than the cold compile costs."""
    return remaining_steps * eager_step_seconds * COMPILE_SAVING > COLD_COMPILE_SECONDS
