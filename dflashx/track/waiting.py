"""What a stage waits on, written where `dflashx status` and the run's stall watchdog read it.

A stage (or a process it launched) that blocks on something outside itself — a lock, a child
process, a server, the network — says so with `waiting_on(kind, what, detail)`: for the duration,
`<stage folder>/_WAITING.json` holds `{kind, what, detail, pid, host, since}`. The stage folder
comes from `$DFLASHX_STAGE_DIR`, which the stage executor sets for the stage's duration (launched
processes inherit it); without it nothing is written. `read_waiting(stage_dir)` gives the record
back while the process that wrote it is alive (a dead writer's record is stale: None).
`describe(record)` is its one line.

Public API: `STAGE_DIR_ENV`, `WAITING_FILE`, `waiting_on`, `read_waiting`, `describe`, `pid_alive`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

STAGE_DIR_ENV = "DFLASHX_STAGE_DIR"
WAITING_FILE = "_WAITING.json"
log = logging.getLogger(__name__)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (a zombie counts as dead)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


@contextmanager
def waiting_on(kind: str, what: str, detail: str = "") -> Iterator[None]:
    """While the block runs, the stage says it waits on `kind` (lock, child, server, network) `what`."""
    folder = os.environ.get(STAGE_DIR_ENV)
    log.info("waiting on %s %s%s", kind, what, f" ({detail})" if detail else "")
    if not folder or not Path(folder).is_dir():
        yield
        return
    path = Path(folder) / WAITING_FILE
    record = {"kind": kind, "what": what, "detail": detail, "pid": os.getpid(), "host": socket.gethostname(),
              "since": time.time()}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(record) + "\n")
    tmp.replace(path)  # whole, for a reader at any moment
    try:
        yield
    finally:
        try:
            if json.loads(path.read_text()).get("pid") == os.getpid():
                path.unlink()
        except (OSError, ValueError):
            pass


def read_waiting(stage_dir: Path) -> dict[str, Any] | None:
    """The stage's live wait record, or None (no record, unreadable, or its writer is dead)."""
    try:
        record = json.loads((Path(stage_dir) / WAITING_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    same_host = record.get("host") == socket.gethostname()
    if same_host and not pid_alive(int(record.get("pid", 0))):
        return None
    return record


def describe(record: dict[str, Any], now: float | None = None) -> str:
    """`waiting on lock /path (held by pid 12 ...) for 40 s`."""
    waited = (now if now is not None else time.time()) - float(record.get("since", 0))
    detail = f" ({record['detail']})" if record.get("detail") else ""
    return f"waiting on {record.get('kind', '?')} {record.get('what', '?')}{detail} for {waited:.0f} s"
