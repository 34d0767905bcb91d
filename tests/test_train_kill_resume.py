"""`dflashx run recipes/tiny.yaml` against kills of the train stage, as real processes: a run SIGKILLed
(its process group) at the engine set-up, the first steps and the first checkpoint resumes to the
uninterrupted run's final checkpoint. The stages before train run once (a module fixture). (The op build
and its locks these tests also killed are gone since issue 38: no op is compiled at run time.)"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def _env(root: Path, **extra: str) -> dict[str, str]:
    return os.environ | {"PYTHONPATH": str(REPO), "DFLASHX_CACHE": str(root / "cache"),
                         "WANDB_MODE": "offline", "WANDB_SILENT": "true",
                         "COLUMNS": "400"} | extra


SHORT = ["stages.train.epochs=2", "stages.train.checkpoint_every=20"]  # 70 steps, a checkpoint every 20


def _argv(run_dir: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "dflashx.cli.main", "run", "recipes/tiny.yaml", *SHORT, "--run-dir", str(run_dir),
            *more]


def _run(run_dir: Path, env: dict[str, str], *more: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(_argv(run_dir, *more), cwd=REPO, env=env, capture_output=True, text=True, timeout=1200,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory) -> Path:
    """A run with every stage before train done."""
    root = tmp_path_factory.mktemp("tokenized")
    _run(root / "run", _env(root), "--until", "tokenize")
    return root


def _copy(tokenized: Path, dest: Path) -> Path:
    shutil.copytree(tokenized / "run", dest / "run", symlinks=True)
    shutil.copytree(tokenized / "cache", dest / "cache", symlinks=True)
    return dest / "run"


@pytest.fixture(scope="module")
def reference(tokenized, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The train stage uninterrupted."""
    root = tmp_path_factory.mktemp("reference")
    run = _copy(tokenized, root)
    return run, _run(run, _env(root), "--until", "train")


def _watch(proc: subprocess.Popen, ready: Callable[[], bool], what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"no {what} in {timeout} s"
        time.sleep(0.05)


def _killed_at(run: Path, env: dict[str, str], ready: Callable[[float], bool], what: str) -> None:
    """Start the run, SIGKILL its whole process group once `ready(start time)`."""
    start = time.time()
    proc = subprocess.Popen(_argv(run, "--until", "train"), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _watch(proc, lambda: ready(start), what)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert not (run / "train" / "_SUCCESS").exists(), f"killed at {what}, yet the stage finished"


def _written(path: Path, seconds: float = 0.0) -> Callable[[float], bool]:
    """`path` written by this attempt (after `start`), `seconds` ago or more."""
    def ready(start: float) -> bool:
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            return False
        return mtime >= start and time.time() - mtime >= seconds
    return ready


def test_sigkilled_at_each_point_of_the_train_setup_then_resumed(tokenized, reference, tmp_path):
    run = _copy(tokenized, tmp_path)
    _killed_at(run, _env(tmp_path), _written(run / "train" / "_STARTED", 2.0), "the engine set-up")
    _killed_at(run, _env(tmp_path), _written(run / "train" / "logs" / "kernels.json"), "the first steps")
    _killed_at(run, _env(tmp_path), _written(run / "train" / "checkpoints" / "latest"), "the first checkpoint")
    _run(run, _env(tmp_path), "--until", "train")
    ours = load_file(run / "train" / "checkpoint" / "model.safetensors")
    theirs = load_file(reference[0] / "train" / "checkpoint" / "model.safetensors")
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-4, atol=1e-5, msg=name)
