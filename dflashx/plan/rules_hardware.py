"""Rules about the hardware profile's own facts: the ones `hardware: local` could neither read on this
machine nor look up in the GPU table (`HardwareProfile.unknown`, a GPU's null figures), each with what it
changes in the plan and the fix; and `local`'s missing price."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from dflashx.config.gpus import STAND_IN
from dflashx.config.load import LOCAL_PROFILE
from dflashx.plan.context import PlanContext
from dflashx.plan.findings import Finding, warning

# key -> (what it is, what not knowing it changes in the plan, the value to give)
UNKNOWN: dict[str, tuple[str, str, str]] = {
    "gpu.bf16_tflops": (
        "dense BF16 TFLOP/s", "the plan cannot price compute: training, generation and evaluation times, and the "
        f"trainer's MFU, use the GPU table's slowest BF16 peak ({STAND_IN.bf16_tflops:g} TFLOP/s), not this GPU's",
        "the datasheet's dense (not sparse) BF16 TFLOP/s"),
    "gpu.bandwidth_tbs": (
        "memory bandwidth", "memory-bound times (generation, evaluation, the held-out τ) use the GPU table's "
        f"slowest bandwidth ({STAND_IN.bandwidth_tbs:g} TB/s), not this GPU's", "the datasheet's TB/s"),
    "gpu.fp8_tflops": (
        "FP8 support", "FP8 settings (target, drafter, served weights, KV cache) are refused",
        "the datasheet's dense FP8 TFLOP/s"),
    "interconnect_gbs": (
        "GPU-to-GPU bandwidth", "gradient sync and tensor-parallel all-reduce times are not counted, and the "
        "serving layout assumes no NVLink (one server per GPU behind the router)", "GB/s per GPU and direction"),
    "host_memory_gb": (
        "host memory", "SGLang's hierarchical cache is not checked against host memory", "the node's GB"),
}


def unknown_hardware(ctx: PlanContext) -> Iterable[Finding]:
    """One warning per unknown fact: a GPU's null figure, or a key `local` listed as unknown."""
    hw = ctx.recipe.hardware
    keys = [] if hw.gpu is None else [k for k in ("gpu.bf16_tflops", "gpu.bandwidth_tbs")
                                      if getattr(hw.gpu, k.removeprefix("gpu.")) is None]
    keys += [k for k in hw.unknown if k not in keys and k in UNKNOWN]
    where = f"GPU {hw.gpu.name!r}" if hw.gpu is not None else "this machine"
    for key in keys:
        what, changes, value = UNKNOWN[key]
        source = "not in dflashx's GPU table (dflashx/config/gpus.py)" if key.startswith("gpu.") else \
            "not readable on this machine"
        yield warning("unknown_hardware", f"hardware.{key}", f"{where}: {what} unknown ({source}): {changes}",
                      f"write a profile of this machine (docs/hardware.md, \"Adding a profile\") and plan with "
                      f"hardware=NAME, or give it: hardware.{key}=<{value}>")


def local_price(ctx: PlanContext) -> Iterable[Finding]:
    """`hardware: local` knows no price: its costs are $0 unless the recipe gives one."""
    hw = ctx.recipe.hardware
    if hw.name == LOCAL_PROFILE and hw.gpu is not None and hw.usd_per_gpu_hour == 0:
        yield warning("local_no_price", "hardware.usd_per_gpu_hour",
                      "hardware: local knows no price: the plan's costs are $0 and budget.max_usd checks nothing",
                      "set hardware.usd_per_gpu_hour=PRICE (per GPU-hour), or leave it at 0 on your own hardware")


HARDWARE_RULES: tuple[Callable[[PlanContext], Iterable[Finding]], ...] = (unknown_hardware, local_price)
