"""Per-device numbers of a hardware profile (GPU or the CPU fallback) and its calibrated ratios."""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.config.gpus import gpu_model
from dflashx.config.schema import HardwareProfile

# Keys `dflashx calibrate` and `dflashx pilot` write into `hardware.calibrated`: measured generation
# tokens/s over the serving model's prediction for the same conditions, the MFU the trainer measured, and the
# seconds one held-out τ measurement took (the pilot's training, the same slice), and the seconds of one batched
# draft-verify cycle in it (what the eval stage's batched decodes cost per cycle on this node); and the seconds the
# run's own ingest stage took when the pilot ran it (the run then skips it: its key is unchanged).
CALIBRATED_SERVING = "serving_ratio"
CALIBRATED_MFU = "training_mfu"
CALIBRATED_TAU_PROBE = "tau_probe_seconds"
CALIBRATED_DECODE_CYCLE = "decode_cycle_seconds"
CALIBRATED_INGEST = "ingest_seconds"
CALIBRATED_KEYS = (CALIBRATED_SERVING, CALIBRATED_MFU, CALIBRATED_TAU_PROBE, CALIBRATED_DECODE_CYCLE, CALIBRATED_INGEST)


@dataclass(frozen=True)
class Device:
    name: str
    memory_bytes: float | None  # None: host memory, not planned
    bandwidth_bps: float
    bf16_flops: float
    fp8_flops: float | None
    count: int  # GPUs in the profile; 1 for the CPU

    def peak_flops(self, precision: str) -> float:
        if precision == "fp8" and self.fp8_flops:
            return self.fp8_flops
        return self.bf16_flops


def device_of(profile: HardwareProfile) -> Device:
    gpu = profile.gpu
    if gpu is None:
        return Device("cpu", None, profile.cpu_bandwidth_tbs * 1e12, profile.peak_flops, None, 1)
    return Device(
        gpu.name, gpu.memory_gb * 1e9, gpu.priced_bandwidth_tbs * 1e12, profile.peak_flops,
        gpu.fp8_tflops * 1e12 if gpu.fp8_tflops else None, max(profile.num_gpus, 1),
    )


def table_device(name: str) -> Device:
    """One GPU of the GPU table's model `name` (`dflashx.config.gpus`): where a measurement was made."""
    model = gpu_model(name)
    if model is None or model.memory_gb is None:
        raise KeyError(f"{name!r}: not a model of the GPU table with its memory (dflashx/config/gpus.py)")
    return Device(model.name, model.memory_gb * 1e9, model.bandwidth_tbs * 1e12, model.bf16_tflops * 1e12,
                  model.fp8_tflops * 1e12 if model.fp8_tflops else None, 1)


def factor(profile: HardwareProfile, key: str, default: float) -> tuple[float, bool]:
    """(value, calibrated?): a calibrated value wins over the default."""
    if key in profile.calibrated:
        return profile.calibrated[key], True
    return default, False


def pilot_ingest_seconds(profile: HardwareProfile) -> float | None:
    """The seconds of the run's own ingest stage as its pilot ran it (`hardware.calibrated.ingest_seconds`; the run
    then skips the stage), or None: the one answer to whether the plan's ingest was measured whole."""
    value = profile.calibrated.get(CALIBRATED_INGEST)
    return None if value is None else float(value)
