"""What a waiting stage says (`dflashx.track.waiting`, `dflashx.run.watchdog`, `dflashx.run.status.waits`):
a wait record a dead writer left is stale, the stall watchdog names the declared wait, else the stage's
child processes (W&B's service left out). Real processes hold the waits and die."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from dflashx.run.status import waits
from dflashx.run.watchdog import STALL_FILE, Watchdog, read_stall, waits_on
from dflashx.track.waiting import STAGE_DIR_ENV, WAITING_FILE, read_waiting, waiting_on


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def test_a_dead_writers_wait_record_is_stale(tmp_path, monkeypatch):
    monkeypatch.setenv(STAGE_DIR_ENV, str(tmp_path))
    with waiting_on("server", "http://127.0.0.1:30000", "health check"):
        record = read_waiting(tmp_path)
        assert record is not None and record["kind"] == "server"
        data = json.loads((tmp_path / WAITING_FILE).read_text())
    assert not (tmp_path / WAITING_FILE).exists()
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    (tmp_path / WAITING_FILE).write_text(json.dumps(data | {"pid": proc.pid}))
    assert read_waiting(tmp_path) is None and waits(tmp_path) is None


def test_the_watchdog_names_the_wait_once_the_stage_stalls(tmp_path, monkeypatch):
    monkeypatch.setenv(STAGE_DIR_ENV, str(tmp_path))
    said: list[str] = []
    dog = Watchdog("train", tmp_path, estimate_s=10, say=said.append, factor=4, floor_s=1)
    t0 = dog.last
    assert dog.check(t0 + 39) is None  # within 4x the planned 10 s
    with waiting_on("lock", "/runs/tiny/.lock", "held by pid 1"):
        line = dog.check(t0 + 41)
        assert line is not None and "no progress for 41 s (planned 10 s)" in line
        assert "waiting on lock /runs/tiny/.lock (held by pid 1)" in line
        assert read_stall(tmp_path) is not None
        assert dog.check(t0 + 42) is None  # said once per threshold
    dog.progressed()
    assert dog.check(dog.last + 1) is None
    stalled = dog.check(dog.last + 100)
    assert stalled is not None and "it works in its own process" in stalled
    assert waits(tmp_path) == stalled.removeprefix("~ ")
    with dog:
        pass
    assert not (tmp_path / STALL_FILE).exists()


def test_the_watchdog_names_a_child_process(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        time.sleep(0.2)
        said = waits_on(tmp_path)
        assert said.startswith("no wait declared; its child processes: ")
        assert f"pid {child.pid}: {sys.executable} -c import time" in said
    finally:
        _kill(child)


def test_the_watchdog_leaves_out_the_wandb_service(tmp_path):
    """W&B's service process (a child of the run from the first stage on) is never what a stage waits on."""
    fake = tmp_path / "wandb" / "bin" / "wandb-core"
    fake.parent.mkdir(parents=True)
    fake.write_text(f"#!{sys.executable}\nimport time; time.sleep(600)\n")
    fake.chmod(0o755)
    service = subprocess.Popen([str(fake), "--port-filename", "x"])
    try:
        time.sleep(0.3)
        assert str(service.pid) not in waits_on(tmp_path)
    finally:
        _kill(service)


@pytest.fixture(autouse=True)
def _own_env(monkeypatch):
    monkeypatch.delenv(STAGE_DIR_ENV, raising=False)
    yield
