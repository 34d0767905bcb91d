"""Provenance: what ran, where, with what code and software, written as `<stage>/provenance.json`.

`environment_facts()` gathers the facts that do not change during a process (cached): dflashx
version and git commit (+ dirty flag; None outside a git checkout), every installed distribution's
version (importlib.metadata, never a shell pipe), Python, platform, hostname, and torch / CUDA /
cuDNN / driver / GPU names and count when torch is importable. `stage_provenance(...)` adds the
stage's command line, resolved recipe, inputs, outputs, times and exit state. Everything that came
from the user or the environment (argv, recipe, env vars, messages) goes through `redact`.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import platform
import re
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dflashx
from dflashx.track.redact import redact, redact_argv

ENV_PREFIXES = ("CUDA_", "NCCL_", "SLURM_", "WANDB_", "HF_", "DFLASHX_", "DS_", "TORCH_", "PYTORCH_",
                "OMP_", "MASTER_", "AWS_")
ENV_NAMES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TOKENIZERS_PARALLELISM", "PATH", "VIRTUAL_ENV", "CONDA_PREFIX")


def _git(args: Sequence[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(path: Path | None = None) -> dict[str, Any]:
    """Commit and dirty flag of the git checkout holding `path` (default: the dflashx package)."""
    cwd = path or Path(dflashx.__file__).resolve().parent
    commit = _git(["rev-parse", "HEAD"], cwd)
    if commit is None:
        return {"commit": None, "dirty": None}
    status = _git(["status", "--porcelain", "--untracked-files=no"], cwd)
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def package_versions() -> dict[str, str]:
    """Installed distributions -> version, via importlib.metadata (sorted by name)."""
    versions = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            versions[name] = dist.version
    return dict(sorted(versions.items(), key=lambda kv: kv[0].lower()))


def _nvml_driver() -> str | None:
    if importlib.util.find_spec("pynvml") is None:
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
    except Exception:  # noqa: BLE001 - NVML missing or broken
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def _proc_driver() -> str | None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    match = re.search(r"Kernel Module(?: for [\w-]+)?\s+([0-9][0-9.]+)", text)
    return match.group(1) if match else None


def _driver_version() -> str | None:
    """NVIDIA driver version through NVML (pynvml), else /proc/driver/nvidia/version."""
    return _nvml_driver() or _proc_driver()


def torch_facts() -> dict[str, Any] | None:
    """torch, CUDA, cuDNN, driver and GPUs when torch is importable; None otherwise."""
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return None
    import torch

    facts: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                             "cuda_available": False, "gpu_count": 0, "gpus": [], "driver": None}
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        facts.update(
            cuda_available=True, gpu_count=count,
            gpus=[torch.cuda.get_device_name(i) for i in range(count)],
            cudnn=torch.backends.cudnn.version(), driver=_driver_version(),
        )
    return facts


def selected_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment variables worth recording (redacted by the caller)."""
    environ = dict(os.environ if environ is None else environ)
    return {k: v for k, v in sorted(environ.items()) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}


@functools.lru_cache(maxsize=1)
def environment_facts() -> dict[str, Any]:
    """Facts about the code, software and machine; computed once per process."""
    return {
        "dflashx": {"version": dflashx.__version__, "git": git_state()},
        "python": {"version": sys.version, "executable": sys.executable,
                   "implementation": platform.python_implementation()},
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "packages": package_versions(),
        "torch": torch_facts(),
    }


def stage_provenance(
    *,
    stage: str,
    stage_key: str,
    argv: Sequence[str],
    resolved: dict[str, Any],
    started_at: str,
    ended_at: str,
    exit_state: str,
    inputs: dict[str, str | None],
    outputs: dict[str, str | None],
    message: str | None = None,
    estimates: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The provenance record of one stage attempt (secrets redacted)."""
    return {
        "stage": stage,
        "stage_key": stage_key,
        "exit_state": exit_state,
        "message": redact(message) if message else None,
        "started_at": started_at,
        "ended_at": ended_at,
        "command_line": redact_argv(argv),
        "cwd": os.getcwd(),
        "pid": os.getpid(),
        "inputs": inputs,
        "outputs": outputs,
        "plan_estimates": estimates or {},
        **environment_facts(),
        "env": redact(selected_env()),
        "resolved_recipe": redact(resolved),
    }
