"""The GPU datasheet table: one row per GPU model, the one source of a GPU's facts for the built-in
hardware profiles (`gpu: {name: H200}` fills the rest from here: `dflashx.config.hardware.GpuSpec`) and for
`hardware: local` (the detected name matched to a row: `match_gpu`). Sources: docs/hardware.md.

Figures are per GPU: dense (not sparse) BF16 and FP8 TFLOP/s, memory bandwidth in TB/s, NVLink bandwidth
in GB/s per direction (None: no NVLink), and the memory the driver reports in GB (nvidia-smi's MiB x
1.048576 / 1000; None where this project has no reading: a profile then states it, `local` reads it).
`fp8_tflops` None: no FP8. Pure data: no I/O.

Public API: `GpuModel`, `GPUS`, `gpu_model(name)`, `match_gpu(detected_name)`, `STAND_IN`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    name: str  # the profile's `gpu.name` for this model
    pattern: str  # matches the driver's name (nvidia-smi, torch), normalised by `_normalised`
    bf16_tflops: float
    fp8_tflops: float | None
    bandwidth_tbs: float
    nvlink_gbs: float | None
    memory_gb: float | None = None


# Most specific first: the first row whose pattern matches a detected name is its model.
GPUS: tuple[GpuModel, ...] = (
    GpuModel("B200", r"\bb200\b", 2250, 4500, 7.7, 900, 192.3),
    GpuModel("H200 NVL", r"\bh200 nvl\b", 835.5, 1670.5, 4.8, 450),
    GpuModel("H200", r"\bh200\b", 989, 1979, 4.8, 450, 150.8),
    GpuModel("H100 NVL", r"\bh100 nvl\b", 835.5, 1670.5, 3.9, 300),
    GpuModel("H100 PCIe", r"\bh100\b.*\bpcie\b", 756.5, 1513, 2.0, 300),
    GpuModel("H100", r"\bh100\b", 989, 1979, 3.35, 450, 85.5),  # SXM: "NVIDIA H100 80GB HBM3"
    GpuModel("RTX PRO 6000 Blackwell", r"\brtx pro 6000 blackwell\b(?!.*\bmax q\b)", 503.8, 1007.6, 1.792, None,
             102.6),
    GpuModel("L40S", r"\bl40s\b", 362.05, 733, 0.864, None),
    GpuModel("A100 SXM4 80GB", r"\ba100\b(?=.*\bsxm\d*\b)(?=.*\b80gb\b)", 312, None, 2.039, 300),
    GpuModel("A100 SXM4 40GB", r"\ba100\b(?=.*\bsxm\d*\b)(?=.*\b40gb\b)", 312, None, 1.555, 300),
    GpuModel("A100 PCIe 80GB", r"\ba100\b(?=.*\bpcie\b)(?=.*\b80gb\b)", 312, None, 1.935, 300),
    GpuModel("A100 PCIe 40GB", r"\ba100\b(?=.*\bpcie\b)(?=.*\b40gb\b)", 312, None, 1.555, 300),
)
_BY_NAME = {g.name.lower(): g for g in GPUS}

# What the planner prices a GPU of unknown figures with (said in its `unknown_hardware` warning): the
# table's slowest BF16 peak and bandwidth, so an unknown GPU's plan errs long rather than short.
STAND_IN = GpuModel("unknown GPU (the table's slowest figures)", "", min(g.bf16_tflops for g in GPUS), None,
                    min(g.bandwidth_tbs for g in GPUS), None)


def _normalised(name: str) -> str:
    """Lower case, `-`/`_` as spaces, no `NVIDIA` prefix: `NVIDIA A100-SXM4-80GB` -> `a100 sxm4 80gb`."""
    words = re.sub(r"[-_]", " ", name.lower()).split()
    return " ".join(words[1:] if words[:1] == ["nvidia"] else words)


def gpu_model(name: str) -> GpuModel | None:
    """The table's row named `name` (a profile's `gpu.name`, case-insensitive), or None."""
    return _BY_NAME.get(name.strip().lower())


def match_gpu(detected: str) -> GpuModel | None:
    """The row of the GPU the driver calls `detected` (e.g. `NVIDIA H100 80GB HBM3`,
    `NVIDIA RTX PRO 6000 Blackwell Server Edition`, `NVIDIA A100-SXM4-80GB`), or None when no row matches."""
    name = _normalised(detected)
    return next((g for g in GPUS if re.search(g.pattern, name)), None)
