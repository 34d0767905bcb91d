"""Inference servers for the server backends (SGLang, vLLM): launch this node's servers of the launch plan,
reach the rest, start again one that exits.

Where servers start is decided here, once: a machine starts only the launch plan's servers whose `node`
is its own (`node_rank`: `DFLASHX_NODE_RANK`, which `dflashx run --node-rank K` sets; 0 when unset) and
reaches every other node's servers at their addresses (`reachable`: `dflashx.backends.nodes.node_address`,
`DFLASHX_NODE_HOSTS` else the planned `node-<i>` names). Node 0 drives generation; node K > 0 only serves
(docs/running.md). Launched servers
run in their own process group with `CUDA_VISIBLE_DEVICES` set from the plan's `gpus` and the plan's `env`,
stdout+stderr appended to `server-<port>.log` in the stage folder (each launch starts with a `dflashx:` header
line, so every launch's log is kept), and are stopped (SIGTERM, then SIGKILL) on exit. What the planner could
not know is filled in at launch (`LaunchArgs`): the interpreter a command's leading `python` means
(`stages.generate.server_python`, else the one running dflashx) and the located target folder for a
`builtin:` model. Nothing is sent before every server answers `GET /health` with 200; a launched server that
exits while starting fails at once with the tail of its log. One that exits later, while generating, is
started again by `revive` (at most `restarts` times in all), and the requests that failed are sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import httpx

from dflashx.backends.nodes import NODE_RANK_ENV, NodeAddressError, node_address
from dflashx.plan.launch import LaunchPlan, ServerSpec, base_url
from dflashx.track.waiting import waiting_on

class ServerError(RuntimeError):
    """A server did not come up (exited, or not healthy before the startup timeout)."""


@dataclass(frozen=True)
class LaunchArgs:
    """What a launched command's words become on this machine (module doc): `python` (its leading word) and
    each `replace` pair's first word anywhere."""

    python: str = sys.executable
    replace: tuple[tuple[str, str], ...] = ()

    def command(self, words: tuple[str, ...]) -> list[str]:
        swap = dict(self.replace)
        out = [swap.get(w, w) for w in words]
        return [self.python, *out[1:]] if out and out[0] == "python" else out


def reachable(plan: LaunchPlan, env: Mapping[str, str] | None = None) -> tuple[ServerSpec, ...]:
    """The plan's servers as node 0 (the driver) reaches them: node 0's and attached ones at their planned
    address, node i's at `node_address(i)` (`DFLASHX_NODE_HOSTS`'s i-th address, else the planned `node-<i>`
    name), which must resolve (else a clear error: nothing is waited for in vain)."""
    out = []
    for server in plan.servers:
        if not server.node:
            out.append(server)
            continue
        try:
            host = node_address(server.node, env)
        except NodeAddressError as e:
            raise ServerError(f"node {server.node}'s server {server.url} has no address: {e} (as the training "
                              "hostfile does), or start the servers yourself and give stages.generate.urls") from None
        out.append(server.at_host(host))
    return tuple(out)


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
    """Block until every `<url>/health` answers 200 (said as the stage's wait: `dflashx status`); raise
    ServerError on exit or timeout."""
    pending = [base_url(u) for u in urls]
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=min(10.0, timeout_s)) as client, \
            waiting_on("server", ", ".join(pending), "starting: GET /health until 200"):
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
    """Context manager: start `node`'s servers of `plan` (logs into `log_dir`), wait until the servers it uses
    answer (node 0: all of them, node K: its own), stop what it started on exit."""

    def __init__(self, plan: LaunchPlan, node: int, log_dir: Path, startup_timeout_s: float, poll_s: float = 1.0,
                 env: Mapping[str, str] | None = None, args: LaunchArgs | None = None, restarts: int = 0):
        if plan.nodes and node not in plan.nodes:
            raise ServerError(f"this is node {node} ({NODE_RANK_ENV}), but the plan's servers run on nodes "
                              f"{', '.join(map(str, plan.nodes))}: start node i with `dflashx run ... --node-rank i`")
        self.local = plan.on_node(node)
        self.servers = reachable(plan, env) if node == 0 else self.local
        self.log_dir = log_dir
        self.startup_timeout_s = startup_timeout_s
        self.poll_s = poll_s
        self.procs: dict[str, tuple[subprocess.Popen, Path]] = {}
        self.args = args or LaunchArgs()
        self.restarts, self.restarted = restarts, 0
        self._locks: dict[str, asyncio.Lock] = {}

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def __enter__(self) -> "ServerPool":
        if self.local:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for spec in self.local:
                self._start(spec)
            wait_healthy(self.urls, self.startup_timeout_s, self.procs, self.poll_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, spec: ServerSpec) -> None:
        """Start one server, its output appended to its log after a header naming this launch."""
        env = dict(os.environ) | dict(spec.env)
        if spec.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpus)
        command = self.args.command(spec.command)
        log_path = self.log_dir / f"server-{spec.port}.log"
        with log_path.open("ab") as log_file:
            stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
            log_file.write(f"==== dflashx: launch at {stamp}: {' '.join(command)}\n".encode())
            log_file.flush()
            proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        self.procs[spec.url] = (proc, log_path)

    async def revive(self, url: str) -> bool:
        """After a failed request to `url`: True when its launched server had exited and runs again (started here,
        or by another request meanwhile), so the request is sent again; False when it runs (or is not ours)."""
        seen = self.procs.get(url)
        if seen is None:
            return False
        async with self._locks.setdefault(url, asyncio.Lock()):
            proc, log_path = self.procs[url]
            if proc.poll() is None:
                return proc is not seen[0]
            if self.restarted >= self.restarts:
                raise ServerError(f"server {url} exited with code {proc.returncode} while generating, after "
                                  f"{self.restarted} restart(s) (stages.generate.server_restarts); last lines of "
                                  f"{log_path}:\n{_log_tail(log_path)}\nCompletions written so far are kept: rerun "
                                  "to resume.")
            self.restarted += 1
            spec = next(s for s in self.local if s.url == url)
            await asyncio.to_thread(self._start, spec)
            await asyncio.to_thread(wait_healthy, [url], self.startup_timeout_s, self.procs, self.poll_s)
            return True

    def hold(self) -> str:
        """Block while the launched servers run (a node that only serves); say which stopped and how."""
        while True:
            for url, (proc, log_path) in self.procs.items():
                if proc.poll() is not None:
                    return f"server {url} exited with code {proc.returncode} (log: {log_path})"
            time.sleep(self.poll_s)

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
