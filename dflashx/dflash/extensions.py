"""DeepSpeed's compiled ops, built so that no run waits forever on a killed build.

DeepSpeed builds an op it was not installed with at run time (`OpBuilder.jit_load` ->
`torch.utils.cpp_extension.load`), in `$TORCH_EXTENSIONS_DIR/<op>/`, behind torch's `FileBaton`:
a `lock` file created with O_EXCL and removed when the build ends. A build killed with SIGKILL
never removes it, and every later build of that op sleeps while the file exists: forever.

`install()` (called by `setup_distributed`, before DeepSpeed builds anything) makes every build
dflashx triggers safe:
- the folder is keyed by what decides a build (`build_key`: Python, torch, its CUDA, DeepSpeed and
  the C++ compiler), so another venv or toolchain never rebuilds (or half-rebuilds) this one's ops;
  `$TORCH_EXTENSIONS_DIR` set by the caller is used as it is;
- each op's build runs under `<dir>/<op>.owner`, an fcntl lock the kernel releases when its holder
  dies (so a waiter never waits on a dead process), holding the owner's pid and host for the
  waiter's `_WAITING.json` (`dflashx.track.waiting`);
- a baton (`<dir>/<op>/lock`) that no live process holds open is broken, with a log line naming
  it (torch's baton keeps the file open while its build runs: `/proc/*/fd` tells its owner); one a
  live process holds is waited on, said in `_WAITING.json`, and broken once that process is gone;
- an op not built before is built aside (`<dir>/.staging/<op>-<pid>/`) and moved into place whole
  with a `.dflashx-complete` marker, so a killed build leaves no half-built folder in use.
`sweep(dir)` breaks the stale batons of the whole folder up front (a log line each).

On a CPU profile nothing is built: Muon's AdamW half is torch's there (`resolve.deepspeed`), and
one CPU rank skips the shared-memory op (`distributed`). `DFLASHX_FUSED_ADAM=1` gives Muon back
DeepSpeed's compiled Adam on a CPU (`engine_config`: the GPU path's build, to test it here).

Public API: `install`, `extensions_dir`, `build_key`, `sweep`, `baton_holders`, `engine_config`.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dflashx.track.waiting import waiting_on

ROOT_ENV = "TORCH_EXTENSIONS_DIR"
FUSED_ADAM_ENV = "DFLASHX_FUSED_ADAM"
COMPLETE = ".dflashx-complete"
POLL_S = 1.0
log = logging.getLogger(__name__)


@functools.cache
def _compiler() -> str:
    cxx = os.environ.get("CXX", "c++")
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    return f"{cxx}:{out.splitlines()[0] if out else 'none'}"


def build_key() -> str:
    """What decides a build: Python, torch (and its CUDA), DeepSpeed, the C++ compiler."""
    import deepspeed
    import torch

    decided = [sys.version.split()[0], torch.__version__, str(torch.version.cuda), deepspeed.__version__, _compiler()]
    digest = hashlib.sha256("\n".join(decided).encode()).hexdigest()[:10]
    return f"py{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__.split('+')[0]}" \
           f"-ds{deepspeed.__version__}-{digest}"


def extensions_dir() -> Path:
    """`$TORCH_EXTENSIONS_DIR` when set, else `~/.cache/dflashx/torch_extensions/<build_key>`."""
    if os.environ.get(ROOT_ENV):
        return Path(os.environ[ROOT_ENV])
    return Path.home() / ".cache" / "dflashx" / "torch_extensions" / build_key()


def baton_holders(baton: Path) -> list[int] | None:
    """The pids of this host's processes holding `baton` open (torch's builder does while it
    builds); None when /proc cannot tell (not Linux)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    target = os.path.realpath(baton)
    holders = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == target:
                    holders.append(int(entry.name))
                    break
            except OSError:
                continue
    return holders


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


def _break(baton: Path, why: str) -> None:
    try:
        baton.unlink()
    except FileNotFoundError:
        return
    log.warning("broke stale build lock %s (%s)", baton, why)  # into the stage's log (or a rank's)


def _owner_free(owner: Path) -> bool:
    """Whether no live process holds the op's owner lock (taken and released at once when free)."""
    if not owner.exists():
        return True
    fd = os.open(owner, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def sweep(root: Path) -> list[Path]:
    """Break every baton in `root` that no live build holds; the batons broken."""
    broken = []
    for baton in sorted(root.glob("*/lock")) if root.is_dir() else []:
        holders = baton_holders(baton)
        if holders == [] and _owner_free(root / f"{baton.parent.name}.owner"):
            _break(baton, "no live process holds it: left by a killed build")
            broken.append(baton)
    return broken


def _wait_for_baton(baton: Path) -> None:
    """Return once `baton` is gone: now when no live process holds it (broken), else when its holder
    ends (said in `_WAITING.json` meanwhile)."""
    holders = baton_holders(baton) if baton.exists() else []
    if holders == []:
        if baton.exists():
            _break(baton, "no live process holds it: left by a killed build")
        return
    detail = ", ".join(f"held by pid {p}: {_command(p)}" for p in holders) if holders else "holder unknown"
    with waiting_on("lock", str(baton), detail):
        while baton.exists():
            time.sleep(POLL_S)
            if baton_holders(baton) == []:
                _break(baton, "its holder ended without removing it")


@contextmanager
def _owner_lock(owner: Path, op: str) -> Iterator[None]:
    """The op's build lock (fcntl: released by the kernel when its holder dies), recording its owner."""
    owner.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(owner, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held = owner.read_text(errors="replace").strip() or "a live process"
            with waiting_on("lock", str(owner), f"building {op}: {held}"):
                fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "op": op,
                                 "since": time.time()}).encode())
        yield
    finally:
        os.close(fd)


def _move_into_place(built: Path, final: Path) -> None:
    (built / COMPLETE).write_text(json.dumps({"key": final.parent.name, "built_at": time.time()}) + "\n")
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        final.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    built.rename(final)


def safe_jit_load(original: Any, builder: Any, verbose: bool = True) -> Any:
    """DeepSpeed's `jit_load` under the op's owner lock, a stale baton broken, a new build made aside."""
    root = Path(os.environ.get(ROOT_ENV) or extensions_dir())
    name = builder.name
    with _owner_lock(root / f"{name}.owner", name):
        _wait_for_baton(root / name / "lock")
        staging_root = root / ".staging"
        for old in staging_root.glob(f"{name}-*") if staging_root.is_dir() else []:
            shutil.rmtree(old, ignore_errors=True)  # under the owner lock: a dead build's
        if (root / name / COMPLETE).exists():
            return original(builder, verbose)
        staging = staging_root / f"{name}-{os.getpid()}"
        staging.mkdir(parents=True)
        log.warning("building DeepSpeed op %s in %s (moved to %s when whole)", name, staging, root / name)
        os.environ[ROOT_ENV] = str(staging)
        try:
            module = original(builder, verbose)
        finally:
            os.environ[ROOT_ENV] = str(root)
        _move_into_place(staging / name, root / name)
        shutil.rmtree(staging, ignore_errors=True)
        return module


def install() -> Path:
    """Point `$TORCH_EXTENSIONS_DIR` at the keyed folder, break its stale batons, and route
    DeepSpeed's run-time builds through `safe_jit_load` (once per process); the folder."""
    from deepspeed.ops.op_builder.builder import OpBuilder

    root = extensions_dir()
    os.environ[ROOT_ENV] = str(root)
    sweep(root)
    if not getattr(OpBuilder.jit_load, "_dflashx_safe", False):
        original = OpBuilder.jit_load

        def jit_load(self: Any, verbose: bool = True) -> Any:
            return safe_jit_load(original, self, verbose)

        jit_load._dflashx_safe = True  # type: ignore[attr-defined]  # a marker attribute on a function
        OpBuilder.jit_load = jit_load
    return root


def engine_config(config: dict[str, Any]) -> dict[str, Any]:
    """The resolved DeepSpeed config, unchanged unless `DFLASHX_FUSED_ADAM=1` asks for DeepSpeed's
    compiled Adam (Muon's AdamW half) where the plan chose torch's (a CPU profile)."""
    optimizer = config.get("optimizer", {})
    if os.environ.get(FUSED_ADAM_ENV) != "1" or optimizer.get("type") != "Muon" or "torch_adam" not in optimizer.get(
            "params", {}):
        return config
    params = {k: v for k, v in config["optimizer"]["params"].items() if k != "torch_adam"}
    return config | {"optimizer": config["optimizer"] | {"params": params}}
