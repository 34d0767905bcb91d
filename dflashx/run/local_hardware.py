"""`hardware: local`: the hardware profile of the machine dflashx runs on, detected.

The GPUs are read with `nvidia-smi --query-gpu=... --format=csv` (cheap; torch is not imported), or, without
a working nvidia-smi, from torch (imported only then). `CUDA_VISIBLE_DEVICES` selects among nvidia-smi's
GPUs as it does for torch (indices or UUIDs; anything else, a MIG id say, leaves it to torch). The model's
datasheet figures come from the GPU table (`dflashx.config.gpus.match_gpu`); how several GPUs are linked
from `nvidia-smi topo -m` (NVLink between every pair: the table's NVLink figure) or, over PCIe, from the
link generation and width nvidia-smi reports. No GPU: the CPU profile's facts (`cpu.yaml`: its figures do
not depend on the core count). What can be neither read nor looked up is None and listed in the profile's
`unknown`; the planner says what each changes (`dflashx.plan.rules_hardware`). The price is 0 unless the
recipe or an override gives `hardware.usd_per_gpu_hour`.

I/O, so not in the pure planner: the CLI hands `local_profile` to `dflashx.config.load.load_recipe`, which
calls it only for `hardware: local`.

Public API: `SeenGpu`, `local_profile()`, `seen_gpus()`, `nvlinked(gpus)`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dflashx.config.gpus import match_gpu
from dflashx.config.load import LOCAL_PROFILE, load_profile
from dflashx.config.schema import HardwareProfile

SMI_QUERY = "index,uuid,name,memory.total,pcie.link.gen.max,pcie.link.width.max"
SMI_TIMEOUT_S = 20
MIB_GB = 1.048576 / 1000  # nvidia-smi's MiB to GB (1e9 bytes), as the profiles write memory_gb
# PCIe bandwidth per lane and direction, GB/s, after line encoding (128b/130b from Gen3; Gen6: 64 GT/s FLIT)
PCIE_LANE_GBS = {3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


@dataclass(frozen=True)
class SeenGpu:
    """One GPU as nvidia-smi (or torch) reports it."""

    index: int
    uuid: str
    name: str
    memory_mib: float
    pcie_gen: int | None = None
    pcie_width: int | None = None


def _smi(*args: str) -> str | None:
    """nvidia-smi's output, or None when it is missing, fails or hangs."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _int(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def smi_gpus() -> list[SeenGpu] | None:
    """Every GPU nvidia-smi lists, or None when it cannot tell (missing, failing, unparsable)."""
    out = _smi(f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits")
    if out is None:
        return None
    gpus = []
    for line in filter(str.strip, out.splitlines()):
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 6 or _int(cells[0]) is None:
            return None
        try:
            memory = float(cells[3])
        except ValueError:
            return None
        gpus.append(SeenGpu(int(cells[0]), cells[1], cells[2], memory, _int(cells[4]), _int(cells[5])))
    return gpus


def torch_gpus() -> list[SeenGpu]:
    """The GPUs torch sees (after `CUDA_VISIBLE_DEVICES`); torch is imported here only."""
    import torch

    if not torch.cuda.is_available():
        return []
    props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    return [SeenGpu(i, str(getattr(p, "uuid", "")), p.name, p.total_memory / 2**20) for i, p in enumerate(props)]


def visible(gpus: list[SeenGpu], selection: str | None) -> list[SeenGpu] | None:
    """The GPUs `CUDA_VISIBLE_DEVICES` (`selection`) leaves, in its order; None when it names a GPU by
    something else than an index or a UUID prefix (MIG: torch then tells)."""
    if selection is None:
        return gpus
    chosen = []
    for item in (s.strip() for s in selection.split(",")):
        if item.isdigit():
            found = [g for g in gpus if g.index == int(item)]
        elif item.startswith("GPU-"):
            found = [g for g in gpus if g.uuid.startswith(item)]
        elif not item:
            found = []
        else:
            return None
        if not found:
            break  # CUDA ignores the devices after an entry it cannot find
        chosen.append(found[0])
    return chosen


def seen_gpus() -> tuple[list[SeenGpu], str]:
    """This machine's GPUs a training would use, and where they were read (`nvidia-smi` or `torch`)."""
    listed = smi_gpus()
    chosen = visible(listed, os.environ.get("CUDA_VISIBLE_DEVICES")) if listed is not None else None
    if chosen is not None:
        return chosen, "nvidia-smi"
    return torch_gpus(), "torch"


def nvlinked(gpus: list[SeenGpu]) -> bool | None:
    """Whether NVLink joins every pair of `gpus` (`nvidia-smi topo -m`: an `NV<n>` cell); None: unreadable."""
    out = _smi("topo", "-m")
    if out is None:
        return None
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).split() for line in out.splitlines() if line.strip()]
    header = next((cells for cells in lines if cells and re.fullmatch(r"GPU\d+", cells[0])), None)
    if header is None:
        return None
    columns = [int(h[3:]) for h in header if re.fullmatch(r"GPU\d+", h)]
    rows = {int(cells[0][3:]): cells[1:1 + len(columns)] for cells in lines[lines.index(header) + 1:]
            if re.fullmatch(r"GPU\d+", cells[0]) and len(cells) > len(columns)}
    wanted = [g.index for g in gpus]
    if any(i not in rows or i not in columns for i in wanted):
        return None
    return all(re.fullmatch(r"NV\d+", rows[a][columns.index(b)]) is not None for a in wanted for b in wanted if a != b)


def host_memory_gb() -> float | None:
    """MemTotal of /proc/meminfo, GB; None where there is none."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    found = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.MULTILINE)
    return round(int(found.group(1)) * 1024 / 1e9, 1) if found else None


def _interconnect(gpus: list[SeenGpu], nvlink_gbs: float | None) -> tuple[str, float | None, bool]:
    """(the interconnect's description, its GB/s per GPU and direction, whether that figure is unknown)."""
    if len(gpus) < 2:
        return "none (single GPU)", None, False
    linked = nvlinked(gpus)
    if linked:
        return "NVLink (nvidia-smi topo -m: every pair)", nvlink_gbs, nvlink_gbs is None
    if linked is None:
        return "unknown (nvidia-smi topo -m unreadable)", None, True
    gen, width = gpus[0].pcie_gen, gpus[0].pcie_width
    if gen in PCIE_LANE_GBS and width:
        return f"PCIe Gen{gen} x{width} (nvidia-smi; no NVLink between every pair)", \
            round(PCIE_LANE_GBS[gen] * width, 1), False
    return "PCIe (nvidia-smi; link generation or width unreadable)", None, True


def _gpu_profile(gpus: list[SeenGpu], source: str, host_gb: float | None) -> HardwareProfile:
    first = gpus[0]
    model = match_gpu(first.name)
    names = sorted({g.name for g in gpus})
    memory_gb = round(min(g.memory_mib for g in gpus) * MIB_GB, 1)
    gpu: dict[str, object] = {"name": model.name if model else first.name, "memory_gb": memory_gb}
    unknown = [] if model else ["gpu.bandwidth_tbs", "gpu.bf16_tflops", "gpu.fp8_tflops"]
    if model is None:
        gpu |= {"bandwidth_tbs": None, "bf16_tflops": None, "fp8_tflops": None}
    interconnect, link_gbs, link_unknown = _interconnect(gpus, model.nvlink_gbs if model else None)
    unknown += ["interconnect_gbs"] if link_unknown else []
    unknown += ["host_memory_gb"] if host_gb is None else []
    seen = " + ".join(f"{sum(g.name == n for g in gpus)}x {n}" for n in names)
    return HardwareProfile.model_validate({
        "name": LOCAL_PROFILE, "gpu": gpu, "gpus_per_node": len(gpus), "nodes": 1,
        "description": f"this machine ({source}): {seen}, {memory_gb:g} GB each; {os.cpu_count()} CPU cores",
        "interconnect": interconnect, "interconnect_gbs": link_gbs, "host_memory_gb": host_gb,
        "usd_per_gpu_hour": 0.0, "usd_source": "hardware: local knows no price (set hardware.usd_per_gpu_hour)",
        "unknown": unknown})


def local_profile() -> HardwareProfile:
    """The profile of this machine: its GPUs as `seen_gpus` reads them, else the CPU profile's facts."""
    gpus, source = seen_gpus()
    host_gb = host_memory_gb()
    if gpus:
        return _gpu_profile(gpus, source, host_gb)
    cpu = load_profile("cpu")
    return cpu.model_copy(update={  # its figures; not its calibration, measured on other machines
        "name": LOCAL_PROFILE, "host_memory_gb": host_gb, "unknown": [] if host_gb else ["host_memory_gb"],
        "calibrated": {},
        "description": f"this machine: no GPU ({source}); {os.cpu_count()} CPU cores; the cpu profile's figures"})
