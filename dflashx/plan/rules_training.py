"""Rules about how the drafter is trained: the objective against the loss kernel, the label source
against the training mode, and a run too short to learn anything (against the tiny run's measured
needs, and against the held-out τ curve a pilot measured: `ctx.pilot_tau`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from dflashx.resolve.tau import TAU_PROMPTS, TauPoint, curve_text
from dflashx.plan.context import PlanContext
from dflashx.plan.findings import Finding, error, warning
from dflashx.resolve.formulas import steps_per_epoch

Rule = Callable[[PlanContext], Iterable[Finding]]

# How much training the measured tiny curves needed (benchmarks/results/drafter_quality.json,
# `training_needed`: the tiny recipe's default variant, D-PACE + Muon, all 3 seeds): its logged
# expected acceptance length first reached 90% of its final value at optimizer step 260 of 350,
# after 1.5 supervised slots per trainable drafter parameter (the plan's own count of slots per
# step; parameters as `DrafterDims.matrices` counts them: the weight matrices each slot's gradient
# reaches whole, which for DFlash is the count the figure was measured in — DFlash2's codebooks, of
# which a slot reaches k + 1 rows, are not in it). A run planned below a quarter of either has not
# learnt what the tiny run learnt; speculators' defaults make 60 optimizer steps on a data set of the
# tiny's size, below it.
MEASURED_STEPS_TO_90 = 260
MEASURED_SLOTS_PER_PARAM_TO_90 = 1.5
FAR_BELOW = 0.25
# A pilot's held-out τ curve (`PilotCalibration.tau_curve`, at most four points over its steps) is still
# rising at its end when its last point beats the best of the earlier ones by more than RISING_MARGIN of
# that best. A comparison with the best, not a fitted slope: four points of a curve that climbs early and
# then levels off still fit a positive slope, while "the newest drafter is better than every earlier one"
# is what says the plateau has not been reached; the points decode the same held-out prompts greedily, so
# they differ by the drafter, and 2% asks for more than a few prompts' worth of changed acceptances.
RISING_MARGIN = 0.02
SHOWN_POINTS = 3  # the curve's last points a finding quotes


def loss_kernel_fits_objective(ctx: PlanContext) -> Iterable[Finding]:
    train = ctx.recipe.stages.train
    if train.loss_kernel == "liger" and train.loss != "decay_ce":
        yield error("loss_kernel_objective", "stages.train.loss_kernel",
                    f"the liger loss kernel weighs slots by one fixed decay per call, but stages.train.loss is "
                    f"{train.loss} (per-token weights)",
                    "set stages.train.loss_kernel to auto or torch, or stages.train.loss to decay_ce")


def target_labels_need_online(ctx: PlanContext) -> Iterable[Finding]:
    train = ctx.recipe.stages.train
    if train.labels == "target" and train.mode == "offline":
        yield error("labels_offline", "stages.train.labels",
                    "the target's argmax labels come from the target's forward, which offline training does not run",
                    "set stages.train.mode to online, or stages.train.labels to data")


def sharded_target_not_fp8(ctx: PlanContext) -> Iterable[Finding]:
    train, target = ctx.recipe.stages.train, ctx.recipe.target
    if train.target_sharding == "zero3" and target.load_precision == "fp8":
        yield error("shard_fp8_target", "stages.train.shard_target",
                    "the target would be sharded with ZeRO-3, which partitions parameters, but an FP8 target keeps "
                    "its weights in buffers (the trainer stops at load)",
                    "set target.precision to bf16, or stages.train.shard_target to never on a GPU the FP8 target fits")


def tau_needs_whole_target(ctx: PlanContext) -> Iterable[Finding]:
    train = ctx.recipe.stages.train
    if train.tau_every and train.target_sharding == "zero3":
        yield error("tau_sharded", "stages.train.tau_every",
                    "held-out τ is decoded on rank 0 with the whole target, but the target is sharded over the ranks "
                    "(ZeRO-3)", "set stages.train.tau_every to 0 (the eval stage still measures τ), or "
                    "stages.train.shard_target to never where the target fits one GPU")


def tau_needs_held_out_prompts(ctx: PlanContext) -> Iterable[Finding]:
    train = ctx.recipe.stages.train
    if train.tau_every and train.tau_prompts == 0:
        yield warning("tau_no_prompts", "stages.train.tau_every",
                      f"stages.train.tau_every is {train.tau_every}, but dataset.eval_holdout is 0: there are no "
                      "held-out prompts to decode, so no held-out τ is measured while training",
                      f"set dataset.eval_holdout above 0 (the first {TAU_PROMPTS} held-out prompts are decoded), "
                      "or stages.train.tau_every to 0")


def supervised_slots(ctx: PlanContext) -> float:
    """Supervised slots the planned run trains on: sequences x anchors x (block_size - 1)."""
    block = ctx.recipe.drafter.block_size
    return ctx.training.sequences * ctx.training.drafter_tokens_per_sample / block * (block - 1)


def still_rising(curve: tuple[TauPoint, ...]) -> bool:
    """Whether a held-out τ curve's last point beats the best earlier one by more than RISING_MARGIN of it."""
    if len(curve) < 2:
        return False
    best = max(p.tau for p in curve[:-1])
    return curve[-1].tau > best * (1 + RISING_MARGIN)


def _rising_past_the_run(ctx: PlanContext) -> str | None:
    """What the pilot measured when its τ still rose at its last step and the planned run is no longer than
    the pilot (at its step τ was still improving, so the run stops before the curve levels off); else None."""
    curve, steps = ctx.pilot_tau, ctx.training.steps
    if not still_rising(curve) or steps > curve[-1].step:
        return None
    last = curve_text(curve[-SHOWN_POINTS:])
    return (f"the pilot's held-out τ was still rising at its last step ({last}: more than {RISING_MARGIN:.0%} "
            f"above its best before), and the run plans {steps} optimizer steps against the pilot's "
            f"{curve[-1].step}")


def long_enough_to_learn(ctx: PlanContext) -> Iterable[Finding]:
    if not ctx.recipe.stages.train.enabled:
        return
    steps, params = ctx.training.steps, ctx.training.drafter.matrices
    per_param = supervised_slots(ctx) / params
    short = []
    if steps < FAR_BELOW * MEASURED_STEPS_TO_90:
        short.append(f"{steps} optimizer steps (the tiny run needed {MEASURED_STEPS_TO_90})")
    if per_param < FAR_BELOW * MEASURED_SLOTS_PER_PARAM_TO_90:
        short.append(f"{per_param:.3g} supervised slots per trainable parameter (the tiny run needed "
                     f"{MEASURED_SLOTS_PER_PARAM_TO_90:g})")
    rising = _rising_past_the_run(ctx)
    found = [f"far too short to learn: {' and '.join(short)} to reach 90% of its final acceptance length "
             "(benchmarks/results/drafter_quality.json)"] if short else []
    if rising:
        found.append(f"too short for what the pilot measured: {rising}")
    if found:
        past = f", so that it trains well past the pilot's {ctx.pilot_tau[-1].step} steps" if rising else ""
        yield warning("train_too_short", "stages.train.epochs", "the run is " + "; and ".join(found),
                      "raise stages.train.epochs or stages.train.anchors_per_seq, lower stages.train.global_batch, "
                      f"or add data{past}")


def rows_fill_a_batch(ctx: PlanContext) -> Iterable[Finding]:
    """The trainer refuses a dataset whose rows cannot fill one optimizer step on every rank. A warning:
    the count is planned from `dataset.stats`, a guess until the ingest (or a pilot) counts them, and
    tokenize may drop some more."""
    train, rows = ctx.recipe.stages.train, ctx.tokens.samples
    if train.enabled and ctx.tokens.samples > 0 and steps_per_epoch(
            rows, train.micro_batch, train.grad_accum, train.world_size) < 1:
        yield warning("train_rows_short", "stages.train.global_batch",
                      f"the plan expects {rows} training samples (the eval holdout out), fewer than one "
                      f"optimizer step of {train.micro_batch} x {train.grad_accum} x {train.world_size} sequences: "
                      "the train stage would refuse them",
                      "lower stages.train.global_batch, lower dataset.eval_holdout, or add data")


TRAINING_RULES: tuple[Rule, ...] = (loss_kernel_fits_objective, target_labels_need_online, sharded_target_not_fp8,
                                     tau_needs_whole_target, tau_needs_held_out_prompts, long_enough_to_learn,
                                     rows_fill_a_batch)
