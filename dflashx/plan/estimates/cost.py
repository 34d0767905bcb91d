"""GPU-hours and USD: every stage occupies the whole rented node while it runs."""

from __future__ import annotations

from dflashx.config.schema import HardwareProfile


def gpu_hours(seconds: float, profile: HardwareProfile) -> float:
    """Billed GPU-hours: stage wall time x all GPUs of the profile (0 on the CPU profile)."""
    return seconds / 3600 * profile.num_gpus


def usd(seconds: float, profile: HardwareProfile) -> float:
    return gpu_hours(seconds, profile) * profile.usd_per_gpu_hour
