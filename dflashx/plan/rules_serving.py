"""Rules about how the target is served: parallelism, memory, FP8, the binding batch cap, host memory.

Each is a small function of the plan context returning findings; keys name the recipe key to change
(`stages.generate.serving.*`), fixes say how.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from dflashx.plan.context import PlanContext
from dflashx.plan.estimates.generation import estimate_generation
from dflashx.plan.estimates.lengths import OutputLengths
from dflashx.plan.estimates.serving import hicache_host_bytes, running_batch
from dflashx.plan.explain import human_bytes, human_seconds
from dflashx.plan.findings import Finding, error, warning

Rule = Callable[[PlanContext], Iterable[Finding]]
KEY = "stages.generate.serving"


def _launches(ctx: PlanContext) -> bool:
    """dflashx starts the servers (the resolved `serving.mode`) on the profile's GPUs."""
    return ctx.recipe.stages.generate.serving.mode == "spawn" and ctx.recipe.hardware.gpu is not None


def _serves(ctx: PlanContext) -> bool:
    return _launches(ctx) and ctx.recipe.stages.generate.enabled


def tp_dp_matches_gpus(ctx: PlanContext) -> Iterable[Finding]:
    hw, s = ctx.recipe.hardware, ctx.recipe.stages.generate.serving
    if not _launches(ctx):
        return
    if s.tp * s.dp != hw.num_gpus:
        yield error("tp_dp_gpus", f"{KEY}.dp",
                    f"serving tp x dp = {s.tp} x {s.dp} = {s.tp * s.dp}, but profile {hw.name} has {hw.num_gpus} GPUs",
                    f"set {KEY}.tp and {KEY}.dp so that tp x dp = {hw.num_gpus} (or leave them auto)")
    elif s.tp > max(hw.gpus_per_node, 1):
        yield error("tp_dp_gpus", f"{KEY}.tp", f"tp {s.tp} spans nodes ({hw.gpus_per_node} GPUs per node)",
                    f"set {KEY}.tp to at most {hw.gpus_per_node}")


def serving_fits(ctx: PlanContext) -> Iterable[Finding]:
    hw, s = ctx.recipe.hardware, ctx.generation.serving
    if not _serves(ctx):
        return
    assert hw.gpu is not None, "_serves: a GPU node"
    one_seq = ctx.memory["generate"].parts["one_full_sequence"] * s.tp
    if s.pool_bytes is None or s.pool_bytes < one_seq:
        frac = ctx.recipe.stages.generate.serving.mem_fraction_static
        budget = hw.gpu.memory_gb * 1e9 * frac * s.tp
        yield error("serving_memory", f"{KEY}.weight_dtype",
                    f"weights {human_bytes(s.weight_bytes)} + one full-length sequence {human_bytes(one_seq)} "
                    f"do not fit in {human_bytes(budget)} (tp={s.tp} x {hw.gpu.memory_gb:g} GB x "
                    f"mem_fraction_static {frac:g})",
                    f"serve FP8 weights ({KEY}.weight_dtype=fp8 with {KEY}.checkpoint the FP8 checkpoint), raise "
                    f"{KEY}.tp, lower stages.generate.max_tokens, or pick a profile with more GPU memory")


def fp8_supported(ctx: PlanContext) -> Iterable[Finding]:
    hw, s = ctx.recipe.hardware, ctx.recipe.stages.generate.serving
    if hw.gpu is not None and hw.gpu.fp8_tflops is not None:
        return
    where = hw.gpu.name if hw.gpu else "the CPU"
    unknown = "gpu.fp8_tflops" in hw.unknown  # hardware: local on a GPU the table lacks
    support = "FP8 support is unknown" if unknown else "has no FP8 support"
    give = ", or give hardware.gpu.fp8_tflops=<dense FP8 TFLOP/s> if it has" if unknown else ""
    checks = ((f"{KEY}.weight_dtype", s.weight_dtype == "fp8"),
              (f"{KEY}.kv_cache_dtype", s.kv_cache_dtype.startswith("fp8")),
              ("target.precision", ctx.recipe.target.precision == "fp8"),
              ("drafter.precision", ctx.recipe.drafter.precision == "fp8"))
    for key, bad in checks:
        if bad:
            yield error("fp8_unsupported", key, f"FP8 requested but {where} {support}",
                        f"set {key} to bf16 (or auto), or pick a profile whose GPU supports FP8{give}")


def fp8_checkpoint_named(ctx: PlanContext) -> Iterable[Finding]:
    s = ctx.recipe.stages.generate.serving
    if _serves(ctx) and s.online_quantization:
        yield warning("fp8_online_quantization", f"{KEY}.checkpoint",
                      f"FP8 serving of {ctx.recipe.target.model} quantizes its 16-bit weights while loading "
                      "(--quantization fp8); published FP8 figures and the official FP8 checkpoints use "
                      "calibrated block scales",
                      f"set {KEY}.checkpoint to the official FP8 checkpoint (e.g. {ctx.recipe.target.model}-FP8)")


def batch_not_capped(ctx: PlanContext) -> Iterable[Finding]:
    """A client or max_running_requests cap below what memory holds: say what raising it gives."""
    s = ctx.generation.serving
    if not _serves(ctx) or s.binding not in ("client", "max_running_requests"):
        return
    lengths = OutputLengths.of(ctx.recipe.dataset.stats)
    caps = running_batch(ctx.recipe, lengths).caps
    memory = min(v for k, v in caps.items() if k.endswith("_pool"))
    if memory <= s.batch:
        return
    key = "stages.generate.concurrency" if s.binding == "client" else f"{KEY}.max_running_requests"
    gen = ctx.recipe.stages.generate
    raised = ctx.recipe.model_copy(update={"stages": ctx.recipe.stages.model_copy(update={"generate": gen.model_copy(
        update={"concurrency": None, "serving": gen.serving.model_copy(update={"max_running_requests": memory})})})})
    faster = estimate_generation(raised, ctx.tokens, lengths).seconds
    yield warning("serving_batch_capped", key,
                  f"the running batch is capped by {s.binding} at {s.batch} per replica though memory holds "
                  f"{memory}: raising it gives {human_seconds(faster)} instead of "
                  f"{human_seconds(ctx.generation.seconds)}",
                  f"raise {key} to {memory} (or leave it unset)")


def hicache_fits_host(ctx: PlanContext) -> Iterable[Finding]:
    hw, gen = ctx.recipe.hardware, ctx.recipe.stages.generate
    if not _serves(ctx) or not gen.hierarchical_cache or hw.host_memory_gb is None:
        return
    replicas_per_node = max(hw.gpus_per_node // gen.serving.tp, 1)
    per_server = hicache_host_bytes(running_batch(ctx.recipe, OutputLengths.of(ctx.recipe.dataset.stats)))
    need, have = replicas_per_node * per_server, hw.host_memory_gb * 1e9
    if need > have:
        yield error("hicache_host_memory", "stages.generate.hierarchical_cache",
                    f"--enable-hierarchical-cache sizes a host pool of 2 x the device pool per replica: "
                    f"{replicas_per_node} x {human_bytes(per_server)} = {human_bytes(need)}, over the node's "
                    f"{hw.host_memory_gb:g} GB of host memory",
                    "set stages.generate.hierarchical_cache=false, or hardware.host_memory_gb to the node's real "
                    "memory if it has more")


def mtp_pays(ctx: PlanContext) -> Iterable[Finding]:
    """The MTP head costs more than it gains at the planned batch: say so, with both rates."""
    sp = ctx.generation.speculation
    if sp is None or sp.pays or not _serves(ctx):
        return
    yield warning("mtp_slower", "target.mtp",
                  f"at batch {sp.spec_batch.value} per replica the MTP head gives {sp.spec.tokens_per_second:,.0f} "
                  f"tokens/s against {sp.plain.tokens_per_second:,.0f} without it (tau {sp.spec.tau:.2f}; "
                  "--explain: generate.speculation)",
                  "set target.mtp=false, or fewer stages.generate.serving.speculative.num_steps")


SERVING_RULES: tuple[Rule, ...] = (tp_dp_matches_gpus, serving_fits, fp8_supported, fp8_checkpoint_named,
                                   batch_not_capped, hicache_fits_host, mtp_pays)
