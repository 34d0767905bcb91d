"""Inference servers for the sglang backend: launch the plan's commands, or attach to given URLs.

Launched servers run in their own process group with `CUDA_VISIBLE_DEVICES` set from the plan's
`gpus`, stdout+stderr going to `server-<port>.log` in the stage folder, and are stopped (SIGTERM,
then SIGKILL) on exit. Either way, nothing is sent before every server answers `GET /health` with
200; a launched server that exits while starting fails at once with the tail of its log.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx


class ServerError(RuntimeError):
    """A server did not come up (exited, or not healthy before the startup timeout)."""


def base_url(url: str) -> str:
    """`http://host:port` from a URL that may end in `/` or `/v1`."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


@dataclass
class ServerSpec:
    """One server the plan lists: `{command, port, url, gpus, in_flight}`."""

    command: list[str]
    port: int
    url: str
    gpus: list[int] = field(default_factory=list)
    in_flight: int | None = None  # requests the plan keeps open on it (batch x replicas it serves)

    @classmethod
    def from_plan(cls, entry: dict[str, Any]) -> "ServerSpec":
        command = entry["command"]
        command = shlex.split(command) if isinstance(command, str) else [str(c) for c in command]
        port = int(entry["port"])
        in_flight = entry.get("in_flight")
        return cls(command, port, base_url(entry.get("url") or f"http://127.0.0.1:{port}"), list(entry.get("gpus", [])),
                   int(in_flight) if in_flight else None)


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_healthy(
    urls: list[str],
    timeout_s: float,
    procs: dict[str, tuple[subprocess.Popen, Path]] | None = None,
    poll_s: float = 1.0,
) -> None:
    """Block until every `<url>/health` answers 200; raise ServerError on exit or timeout."""
    pending = [base_url(u) for u in urls]
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=min(10.0, timeout_s)) as client:
        while pending:
            for url in list(pending):
                proc_log = (procs or {}).get(url)
                if proc_log and proc_log[0].poll() is not None:
                    raise ServerError(
                        f"server {url} exited with code {proc_log[0].returncode} while starting; "
                        f"last lines of {proc_log[1]}:\n{_log_tail(proc_log[1])}"
                    )
                try:
                    if client.get(f"{url}/health").status_code == 200:
                        pending.remove(url)
                except httpx.HTTPError:
                    pass
            if pending and time.monotonic() > deadline:
                raise ServerError(
                    f"servers not healthy after {timeout_s:.0f}s: {', '.join(pending)} "
                    f"(raise stages.generate.server_startup_timeout_s, or check the server logs)"
                )
            if pending:
                time.sleep(poll_s)


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    """Signal a launched server's whole process group (it ran with start_new_session)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)


class ServerPool:
    """Context manager: launch `specs` (logs into `log_dir`), wait for health, stop them on exit."""

    def __init__(self, specs: list[ServerSpec], log_dir: Path, startup_timeout_s: float, poll_s: float = 1.0):
        self.specs = specs
        self.log_dir = log_dir
        self.startup_timeout_s = startup_timeout_s
        self.poll_s = poll_s
        self.procs: dict[str, tuple[subprocess.Popen, Path]] = {}

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.specs]

    def __enter__(self) -> "ServerPool":
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for spec in self.specs:
                env = dict(os.environ)
                if spec.gpus:
                    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpus)
                log_path = self.log_dir / f"server-{spec.port}.log"
                with log_path.open("ab") as log_file:
                    proc = subprocess.Popen(
                        spec.command, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                        start_new_session=True,
                    )
                self.procs[spec.url] = (proc, log_path)
            wait_healthy(self.urls, self.startup_timeout_s, self.procs, self.poll_s)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM each server's process group, then SIGKILL what is left after `grace_s`."""
        for proc, _ in self.procs.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc, _ in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        self.procs.clear()
