"""DeepSpeed op builds that no killed process can block (`dflashx.dflash.extensions`), and what a
waiting stage says (`dflashx.track.waiting`, `dflashx.run.watchdog`, `dflashx.run.status.waits`).
Real processes hold and die with the locks; the build itself is a stand-in here (the real compiled
op is built in tests/test_cpu_adam.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflashx.dflash import extensions as ext
from dflashx.run.status import waits
from dflashx.run.watchdog import STALL_FILE, Watchdog, read_stall, waits_on
from dflashx.track.waiting import STAGE_DIR_ENV, WAITING_FILE, read_waiting, waiting_on

HOLD = ("import os, sys, time; fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR); print('held', flush=True); "
        "time.sleep(600)")
OWN = """
import sys, time
from pathlib import Path
from dflashx.dflash.extensions import _owner_lock
with _owner_lock(Path(sys.argv[1]), "fused_adam"):
    print("held", flush=True)
    time.sleep(600)
"""


def _holder(code: str, path: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True,
                            env=os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


class FakeBuilder:
    name = "fused_adam"


def _fake_build(calls: list[str]):
    """Stands in for DeepSpeed's jit_load: builds `$TORCH_EXTENSIONS_DIR/<op>/` behind torch's own baton."""
    from torch.utils.file_baton import FileBaton

    def original(builder, verbose=True):
        folder = Path(os.environ[ext.ROOT_ENV]) / builder.name
        folder.mkdir(parents=True, exist_ok=True)
        baton = FileBaton(str(folder / "lock"))
        if not baton.try_acquire():
            baton.wait()  # what hangs forever on a stale baton
        else:
            (folder / f"{builder.name}.so").write_text("built")
            baton.release()
        calls.append(os.environ[ext.ROOT_ENV])
        return "module"

    return original


def test_build_key_names_what_decides_a_build(monkeypatch):
    import deepspeed
    import torch

    key = ext.build_key()
    assert f"py{sys.version_info.major}{sys.version_info.minor}" in key and deepspeed.__version__ in key
    assert torch.__version__.split("+")[0] in key
    monkeypatch.delenv(ext.ROOT_ENV, raising=False)
    assert ext.extensions_dir().name == key
    monkeypatch.setenv(ext.ROOT_ENV, "/somewhere/else")
    assert ext.extensions_dir() == Path("/somewhere/else")
    monkeypatch.setenv("CXX", "definitely-not-a-compiler")
    ext._compiler.cache_clear()
    try:
        assert ext.build_key() != key  # another compiler: another folder
    finally:
        monkeypatch.delenv("CXX")
        ext._compiler.cache_clear()


def test_baton_holders_tell_a_live_holder_from_a_dead_one(tmp_path):
    baton = tmp_path / "fused_adam" / "lock"
    baton.parent.mkdir()
    proc = _holder(HOLD, baton)
    try:
        assert ext.baton_holders(baton) == [proc.pid]
    finally:
        _kill(proc)
    assert baton.exists() and ext.baton_holders(baton) == []


def test_sweep_breaks_a_dead_processs_baton_and_keeps_a_live_ones(tmp_path, caplog):
    dead, live = tmp_path / "fused_adam" / "lock", tmp_path / "cpu_adam" / "lock"
    dead.parent.mkdir()
    live.parent.mkdir()
    proc = _holder(HOLD, dead)
    _kill(proc)  # SIGKILL: the baton file stays, nobody holds it
    holder = _holder(HOLD, live)
    try:
        assert ext.sweep(tmp_path) == [dead]
        assert not dead.exists() and live.exists()
        assert f"broke stale build lock {dead}" in caplog.text
    finally:
        _kill(holder)


def test_a_stale_baton_no_longer_hangs_the_build(tmp_path, monkeypatch, caplog):
    """Without dflashx the fake build (torch's FileBaton.wait) would sleep forever on this file."""
    monkeypatch.setenv(ext.ROOT_ENV, str(tmp_path))
    stale = tmp_path / "fused_adam" / "lock"
    stale.parent.mkdir()
    stale.write_text("")
    (tmp_path / "fused_adam" / ext.COMPLETE).write_text("{}")  # built before: torch checks it in place
    calls: list[str] = []
    assert ext.safe_jit_load(_fake_build(calls), FakeBuilder()) == "module"
    assert calls == [str(tmp_path)] and not stale.exists()
    assert f"broke stale build lock {stale}" in caplog.text


def test_a_new_build_is_made_aside_and_moved_into_place_whole(tmp_path, monkeypatch):
    monkeypatch.setenv(ext.ROOT_ENV, str(tmp_path))
    half = tmp_path / "fused_adam"
    half.mkdir()
    (half / "half_built.o").write_text("killed mid-build")  # a folder without the completion marker
    (tmp_path / ".staging" / "fused_adam-1").mkdir(parents=True)  # a killed build's staging folder
    calls: list[str] = []
    ext.safe_jit_load(_fake_build(calls), FakeBuilder())
    assert calls == [str(tmp_path / ".staging" / f"fused_adam-{os.getpid()}")]
    assert os.environ[ext.ROOT_ENV] == str(tmp_path)
    assert sorted(p.name for p in half.iterdir()) == [ext.COMPLETE, "fused_adam.so"]
    assert list((tmp_path / ".staging").iterdir()) == []


def test_a_killed_builders_owner_lock_is_released_by_the_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv(ext.ROOT_ENV, str(tmp_path))
    owner = _holder(OWN, tmp_path / "fused_adam.owner")
    assert not ext._owner_free(tmp_path / "fused_adam.owner")
    assert json.loads((tmp_path / "fused_adam.owner").read_text())["pid"] == owner.pid
    _kill(owner)
    calls: list[str] = []
    t0 = time.monotonic()
    ext.safe_jit_load(_fake_build(calls), FakeBuilder())
    assert calls and time.monotonic() - t0 < 10


def test_waiting_on_a_live_owner_says_so_then_builds_when_it_dies(tmp_path, monkeypatch):
    stage = tmp_path / "train"
    stage.mkdir()
    monkeypatch.setenv(STAGE_DIR_ENV, str(stage))
    monkeypatch.setenv(ext.ROOT_ENV, str(tmp_path / "ext"))
    baton = tmp_path / "ext" / "fused_adam" / "lock"
    baton.parent.mkdir(parents=True)
    (baton.parent / ext.COMPLETE).write_text("{}")
    holder = _holder(HOLD, baton)
    seen: list[str | None] = []

    def kill_once_seen() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and read_waiting(stage) is None:
            time.sleep(0.1)
        seen.append(waits(stage))
        _kill(holder)

    import threading

    watcher = threading.Thread(target=kill_once_seen)
    watcher.start()
    calls: list[str] = []
    ext.safe_jit_load(_fake_build(calls), FakeBuilder())
    watcher.join()
    assert seen[0] is not None and f"waiting on lock {baton}" in seen[0] and f"held by pid {holder.pid}" in seen[0]
    assert calls and not (stage / WAITING_FILE).exists() and not baton.exists()


def test_engine_config_gives_muon_back_its_compiled_adam_only_when_asked(monkeypatch):
    muon = {"optimizer": {"type": "Muon", "params": {"lr": 1.0, "torch_adam": True}}, "bf16": {"enabled": False}}
    adamw = {"optimizer": {"type": "AdamW", "params": {"lr": 1.0, "torch_adam": True}}}
    assert ext.engine_config(muon) is muon
    monkeypatch.setenv(ext.FUSED_ADAM_ENV, "1")
    assert ext.engine_config(muon)["optimizer"]["params"] == {"lr": 1.0}
    assert muon["optimizer"]["params"]["torch_adam"] is True  # the resolved config is not changed
    assert ext.engine_config(adamw) is adamw


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
    with waiting_on("lock", "/ext/fused_adam/lock", "held by pid 1"):
        line = dog.check(t0 + 41)
        assert line is not None and "no progress for 41 s (planned 10 s)" in line
        assert "waiting on lock /ext/fused_adam/lock (held by pid 1)" in line
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
    monkeypatch.delenv(ext.FUSED_ADAM_ENV, raising=False)
    yield
