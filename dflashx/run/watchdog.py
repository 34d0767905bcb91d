"""The stall watchdog: a stage that runs past several times its planned time with no progress says
what it waits on.

`Watchdog(label, out_dir, estimate_s, say)` runs beside a stage (a daemon thread, `with` block).
`progressed()` is called on each metric the stage logs. Once nothing has progressed for
`threshold_s` (`STALL_FACTOR` x the planned seconds, at least `MIN_STALL_S`), it says — to the
progress line (`say`, the observer's message) and to `<stage>/_STALL.json` for `dflashx status` —
what the stage waits on (`waits_on`): what the stage declared (`dflashx.track.waiting`: a lock
path, a server, the network), else its child processes (pid and command), else that it works in
its own process. It says it again each further `threshold_s`; `_STALL.json` goes at the end.

Public API: `Watchdog`, `waits_on(out_dir)`, `read_stall(out_dir)`, `STALL_FILE`, `STALL_FACTOR`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dflashx.store.atomic import atomic_write_text
from dflashx.track.waiting import describe, pid_alive, read_waiting

STALL_FACTOR = 4.0
MIN_STALL_S = 60.0
STALL_FILE = "_STALL.json"


# Helpers a run keeps beside its stages whatever they do: never what a stage waits on (W&B's service
# process lives from the first stage's W&B run to the end of the process).
BACKGROUND_HELPERS = ("wandb-core", "wandb/bin/", "wandb service")


def _children(pid: int) -> list[tuple[int, str]]:
    """The live descendants of `pid` on this host (pid, command), from /proc, background helpers left out."""
    parents: dict[int, int] = {}
    proc = Path("/proc")
    for entry in proc.iterdir() if proc.is_dir() else []:
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[-1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [pid]
    while frontier:
        kids = [c for c, p in parents.items() if p in frontier]
        found += kids
        frontier = kids
    out = []
    for child in found:
        try:
            cmd = (proc / str(child) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if cmd and pid_alive(child) and not any(helper in cmd for helper in BACKGROUND_HELPERS):
            out.append((child, cmd[:120]))
    return out


def waits_on(out_dir: Path) -> str:
    """What the stage in `out_dir` (run by this process) waits on, in words."""
    declared = read_waiting(out_dir)
    if declared is not None:
        return describe(declared)
    children = _children(os.getpid())
    if children:
        return "no wait declared; its child processes: " + "; ".join(f"pid {p}: {cmd}" for p, cmd in children[:3])
    return "no lock, child process, server or network wait declared: it works in its own process"


def read_stall(out_dir: Path) -> dict[str, Any] | None:
    """The watchdog's last word on a stage (`_STALL.json`), while the run that wrote it is alive."""
    try:
        record = json.loads((Path(out_dir) / STALL_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and pid_alive(int(record.get("pid", 0))) else None


class Watchdog:
    """Says what a stage waits on once it has made no progress for `threshold_s` (see the module)."""

    def __init__(self, label: str, out_dir: Path, estimate_s: float | None, say: Callable[[str], object],
                 poll_s: float = 5.0, factor: float = STALL_FACTOR, floor_s: float = MIN_STALL_S):
        self.label, self.out_dir, self.say, self.poll_s = label, Path(out_dir), say, poll_s
        self.estimate_s = estimate_s
        self.threshold_s = max(floor_s, factor * estimate_s) if estimate_s else max(floor_s, 10 * MIN_STALL_S)
        self.last = self.said = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"dflashx-watchdog-{label}", daemon=True)

    def progressed(self) -> None:
        self.last = time.monotonic()

    def check(self, now: float | None = None) -> str | None:
        """The stall line when the stage has stalled and it is time to say so again; else None."""
        now = time.monotonic() if now is None else now
        idle = now - self.last
        if idle < self.threshold_s or now - self.said < self.threshold_s:
            return None
        self.said = now
        planned = f"planned {self.estimate_s:.0f} s" if self.estimate_s else "no planned time"
        line = f"~ {self.label}: no progress for {idle:.0f} s ({planned}); {waits_on(self.out_dir)}"
        atomic_write_text(self.out_dir / STALL_FILE, json.dumps(
            {"line": line, "pid": os.getpid(), "idle_s": round(idle), "ts": time.time()}) + "\n")
        return line

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                line = self.check()
                if line:
                    self.say(line)
            except Exception:  # noqa: BLE001 - the watchdog never stops a stage
                continue

    def __enter__(self) -> "Watchdog":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.poll_s + 1)
        (self.out_dir / STALL_FILE).unlink(missing_ok=True)
