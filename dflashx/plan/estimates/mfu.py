"""Training MFU by GPU generation, target precision and target kind: measured figures, each cited.

MFU here is what the planner divides by and what the trainer logs: useful FLOPs of the one FLOP
model (`dflashx.resolve.flops`) per second, over the device's datasheet dense peak (the profile's
`gpu.bf16_tflops`, or `cpu_tflops`). A benchmark that reports MFU against a matmul peak it measured
itself is converted here: achieved TFLOP/s / datasheet TFLOP/s.

A generation without its own measurement borrows another's figure, and the row says so; so does a
precision or target kind without one. The figures are single-device steps: the drafter's gradient
all-reduce is added by the training estimate (`gradsync.py`), and a pilot's measured MFU (which
includes it) replaces the row altogether (`hardware.calibrated.training_mfu`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.config.gpus import gpu_model
from dflashx.config.schema import HardwareProfile

_H200 = gpu_model("H200")
assert _H200 is not None  # a row of the GPU table
H200_DATASHEET_TFLOPS = _H200.bf16_tflops  # dense BF16, NVIDIA H200 datasheet (the GPU table's, the h200 profiles')

# benchmarks/results/train_step.json (the product trainer at commit d97593b, lent H200, torch 2.11: the
# DeepSpeed engine `dflashx.dflash.trainer` builds, with its GPU defaults — compiled drafter layers,
# liger's fused LM-head loss — on 16 target layers of the real shapes, seq 3072, 512 anchors x block
# 16, 5-layer drafter). Its `mfu` divides by the bf16 matmul peak measured in that run (about 795
# TFLOP/s); these are the useful TFLOP/s it achieved. The fp8 rows are its "fp8 drafter + target" rows.
_TRAIN_STEP = "benchmarks/results/train_step.json (product trainer, commit d97593b), H200"
_H200_TFLOPS = {
    ("bf16", "dense"): (520.6, "qwen3-32b-dense, trainer: 520.6 useful TFLOP/s (65.4% of the measured "
                               "795.6 TFLOP/s matmul peak)"),
    ("bf16", "hybrid"): (458.1, "qwen3.6-27b-hybrid, trainer: 458.1 useful TFLOP/s (57.7% of the measured "
                                "793.4 TFLOP/s; Gated DeltaNet on flash-linear-attention)"),
    ("fp8", "dense"): (541.6, "qwen3-32b-dense, trainer, fp8 drafter + target: 541.6 useful TFLOP/s (68.1% of "
                              "the measured 795.6 TFLOP/s)"),
    ("fp8", "hybrid"): (448.9, "qwen3.6-27b-hybrid, trainer, fp8 drafter + target: 448.9 useful TFLOP/s (56.6% "
                               "of the measured 793.4 TFLOP/s)"),
}
# `dflashx run recipes/tiny.yaml` (commit 84262bb) on the 2-core development machine: the median of the
# 35 windows' `mfu` in train/logs/metrics.jsonl (0.32-0.62; useful FLOP/s over the cpu profile's
# 0.1 TFLOP/s); benchmarks/results/tiny_run.json keeps the run's figures (`python -m benchmarks.tiny_run`).
_CPU_MFU = 0.442
_CPU_SOURCE = ("dflashx run recipes/tiny.yaml on 2 cores (commit 84262bb): median window MFU 0.442 of the cpu "
               "profile's 0.1 TFLOP/s, train/logs/metrics.jsonl (benchmarks/results/tiny_run.json)")


@dataclass(frozen=True)
class MfuRow:
    generation: str  # hopper | blackwell | ada | ampere | cpu
    precision: str  # the target's load precision: bf16 | fp8 | fp32 (the CPU profile)
    kind: str  # dense | hybrid (linear-attention layers)
    mfu: float  # over the datasheet dense peak
    source: str
    borrowed: str = ""  # why this row's figure is another's (empty for a measured row)


MEASURED: dict[tuple[str, str, str], MfuRow] = {
    **{("hopper", precision, kind): MfuRow("hopper", precision, kind, tflops / H200_DATASHEET_TFLOPS,
                                           f"{_TRAIN_STEP}: {what} / {H200_DATASHEET_TFLOPS:g} TFLOP/s datasheet")
       for (precision, kind), (tflops, what) in _H200_TFLOPS.items()},
    ("cpu", "fp32", "dense"): MfuRow("cpu", "fp32", "dense", _CPU_MFU, _CPU_SOURCE),
}

# GPU names (the profile's gpu.name, case-insensitive substrings) by generation; first match wins.
GENERATIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("blackwell", ("b100", "b200", "b300", "gb200", "gb300", "blackwell", "rtx 50")),
    ("hopper", ("h100", "h200", "h800", "h20", "gh200")),
    ("ada", ("l40", "l4", "ada", "rtx 40")),
    ("ampere", ("a100", "a800", "a40", "a30", "a10", "rtx 30")),
)
BORROW_FROM = "hopper"  # the one GPU generation measured


def generation_of(profile: HardwareProfile) -> str:
    if profile.gpu is None:
        return "cpu"
    name = profile.gpu.name.lower()
    return next((gen for gen, keys in GENERATIONS if any(k in name for k in keys)), "unknown")


def mfu_row(profile: HardwareProfile, precision: str, hybrid: bool) -> MfuRow:
    """The table's row for this device, target precision and kind; borrowed rows say from where."""
    gen, kind = generation_of(profile), "hybrid" if hybrid else "dense"
    key = (gen, precision, kind)
    if key in MEASURED:
        return MEASURED[key]
    notes = []
    if gen != "cpu" and gen != BORROW_FROM:
        assert profile.gpu is not None, "generation_of: cpu exactly when there is no GPU"
        what = f"GPU {profile.gpu.name!r} matches no known generation" if gen == "unknown" else \
            f"no {gen.capitalize()} measurement"
        notes.append(f"{what}: {BORROW_FROM.capitalize()}'s fraction of the datasheet peak is assumed")
        gen = BORROW_FROM
    if gen == "cpu":
        notes += [] if precision == "fp32" else [f"no CPU measurement in {precision}: the fp32 figure"]
        notes += [] if kind == "dense" else ["no CPU measurement of a hybrid target: the dense figure"]
        precision, kind = "fp32", "dense"
    elif precision not in ("bf16", "fp8"):
        notes.append(f"no {precision} measurement: the bf16 figure")
        precision = "bf16"
    row = MEASURED[(gen, precision, kind)]
    return MfuRow(*key, row.mfu, row.source, "; ".join(notes))
