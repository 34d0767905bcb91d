"""`dflashx profiles`: a table of the hardware profiles found on the search path."""

from __future__ import annotations

import typer
from rich.table import Table

from dflashx.cli._common import exit_recipe_error, make_console
from dflashx.config.errors import RecipeError
from dflashx.config.load import available_profiles, load_profile, profile_dirs
from dflashx.config.schema import HardwareProfile

COLUMNS = ("profile", "GPU", "GPUs", "memory GB", "TB/s", "BF16 TFLOP/s", "FP8 TFLOP/s", "$/GPU-h",
           "link GB/s", "host GB")


def row(p: HardwareProfile) -> list[str]:
    """One table row; '-' where the profile has no GPU or no FP8."""
    g = p.gpu
    return [
        p.name,
        g.name if g else "CPU",
        str(p.num_gpus),
        f"{g.memory_gb:g}" if g else "-",
        f"{g.bandwidth_tbs:g}" if g else "-",
        f"{g.bf16_tflops:g}" if g else f"{p.peak_flops / 1e12:g} (CPU)",
        f"{g.fp8_tflops:g}" if g and g.fp8_tflops else "-",
        f"{p.usd_per_gpu_hour:.2f}",
        f"{p.interconnect_gbs:g}" if p.interconnect_gbs else "-",
        f"{p.host_memory_gb:g}" if p.host_memory_gb else "-",
    ]


def command() -> None:
    found = available_profiles()
    if not found:
        typer.echo("no hardware profiles in " + ", ".join(str(d) for d in profile_dirs()), err=True)
        raise typer.Exit(1)
    table = Table(title="hardware profiles")
    for col in COLUMNS:
        text = col in ("profile", "GPU")
        table.add_column(col, justify="left" if text else "right", no_wrap=col == "profile")
    failed: list[RecipeError] = []
    for name in found:
        try:
            table.add_row(*row(load_profile(name)))
        except RecipeError as exc:
            failed.append(exc)
    make_console().print(table)
    for error in failed:
        exit_recipe_error(error)  # prints it (the exit it returns is raised once, below)
    if failed:
        raise typer.Exit(RecipeError.exit_code)
