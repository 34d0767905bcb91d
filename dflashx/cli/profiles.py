"""`dflashx profiles`: a table of the hardware profiles found on the search path; `--show NAME` prints one
profile's facts (`--show local`: this machine's, detected), "unknown" where a fact is."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from dflashx.cli._common import detect_local, exit_recipe_error, make_console
from dflashx.config.errors import RecipeError
from dflashx.config.load import LOCAL_PROFILE, available_profiles, load_profile, profile_dirs
from dflashx.config.schema import HardwareProfile

COLUMNS = ("profile", "GPU", "GPUs", "memory GB", "TB/s", "BF16 TFLOP/s", "FP8 TFLOP/s", "$/GPU-h",
           "link GB/s", "host GB")
ShowOpt = Annotated[str | None, typer.Option(
    "--show", help=f"Print one profile's facts; `{LOCAL_PROFILE}`: this machine's, detected.", show_default=False)]
UNKNOWN = "unknown"


def row(p: HardwareProfile) -> list[str]:
    """One table row; '-' where the profile has no GPU or no FP8, 'unknown' where a figure is."""
    g = p.gpu

    def num(value: float | None) -> str:
        return f"{value:g}" if value is not None else UNKNOWN

    return [
        p.name,
        g.name if g else "CPU",
        str(p.num_gpus),
        num(g.memory_gb) if g else "-",
        num(g.bandwidth_tbs) if g else "-",
        num(g.bf16_tflops) if g else f"{p.peak_flops / 1e12:g} (CPU)",
        f"{g.fp8_tflops:g}" if g and g.fp8_tflops else UNKNOWN if "gpu.fp8_tflops" in p.unknown else "-",
        f"{p.usd_per_gpu_hour:.2f}",
        f"{p.interconnect_gbs:g}" if p.interconnect_gbs else UNKNOWN if "interconnect_gbs" in p.unknown else "-",
        f"{p.host_memory_gb:g}" if p.host_memory_gb else UNKNOWN if "host_memory_gb" in p.unknown else "-",
    ]


def facts(p: HardwareProfile, source: str) -> list[tuple[str, str]]:
    """`--show`'s (key, value) lines: the table's columns by key, then the text facts and where they came from."""
    keys = ("name", "gpu.name", "gpus", "gpu.memory_gb", "gpu.bandwidth_tbs", "gpu.bf16_tflops", "gpu.fp8_tflops",
            "usd_per_gpu_hour", "interconnect_gbs", "host_memory_gb")
    lines = [(k, v) for k, v in zip(keys, row(p)) if p.gpu is not None or not k.startswith("gpu.")]
    lines += [("description", p.description), ("interconnect", p.interconnect), ("nodes", str(p.nodes))]
    if p.gpu is None:
        lines += [("cpu_tflops", f"{p.cpu_tflops:g}"), ("cpu_bandwidth_tbs", f"{p.cpu_bandwidth_tbs:g}")]
    lines += [("usd_source", p.usd_source or "-"), ("calibrated", str(p.calibrated or "-")),
              ("unknown", ", ".join(p.unknown) or "-"), ("source", source)]
    return lines


def show(name: str) -> None:
    try:
        p = load_profile(name, local=detect_local)
    except RecipeError as exc:
        raise exit_recipe_error(exc) from None
    source = "detected on this machine (nvidia-smi, torch, /proc/meminfo); datasheet figures: the GPU table " \
        "(dflashx/config/gpus.py)" if name == LOCAL_PROFILE else str(available_profiles()[name])
    table = Table(title=f"hardware profile {name}", show_header=False)
    table.add_column("key", no_wrap=True)
    table.add_column("value")
    for key, value in facts(p, source):
        table.add_row(key, value)
    make_console().print(table)


def command(show_name: ShowOpt = None) -> None:
    if show_name is not None:
        return show(show_name)
    found = available_profiles()
    if not found:
        typer.echo("no hardware profiles in " + ", ".join(str(d) for d in profile_dirs()), err=True)
        raise typer.Exit(1)
    table = Table(title="hardware profiles", caption=f"and `{LOCAL_PROFILE}`: this machine, detected "
                  f"(`dflashx profiles --show {LOCAL_PROFILE}`)")
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
    return None
