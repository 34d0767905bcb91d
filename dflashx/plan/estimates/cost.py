"""GPU-hours and USD: every stage occupies the whole rented node while it runs."""

from __future__ import annotations

from dflashx.config.schema import HardwareProfile


def gpu_hours(seconds: float, profile: HardwareProfile) -> float:
    """Billed GPU-hours: stage wall time x all GPUs of the profile (0 on the CPU profile)."""
    return seconds / 3600 * profile.num_gpus


def node_usd(seconds: float, gpus: int, usd_per_gpu_hour: float) -> float:
    """The one USD formula (planned, P10/P90 and measured costs): wall time x GPUs x the price per GPU-hour."""
    return seconds / 3600 * gpus * usd_per_gpu_hour


def usd(seconds: float, profile: HardwareProfile) -> float:
    """What `seconds` of the profile's whole node costs."""
    return node_usd(seconds, profile.num_gpus, profile.usd_per_gpu_hour)
