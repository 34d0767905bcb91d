"""A full disk is a stop, not a corruption: generation, tokenization and checkpoint saves stop with
a message naming the folder and the space needed, keep the last complete record / dataset /
checkpoint intact, and resume to the same result as an uninterrupted run once space is freed.

`FakeDisk` injects the fault anywhere: writes under a folder past a byte budget write what fits,
then fail with ENOSPC, at the level each writer uses (`os.write`: the shard writer; fsspec's local
file `.write`: `datasets`/Arrow; `torch.save`: DeepSpeed, rank states). `small_fs` mounts a real
tmpfs with `size=`, which needs root mount privileges (skipped where mounting is refused); it shows
what injection cannot: a real `torch.save` on a full disk raises a RuntimeError without errno.
"""

from __future__ import annotations

import errno
import io
import json
import random
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _plan_recipes import seeds_recipe
from datasets import load_from_disk
from helpers_dflash import tiny_dataset, tiny_target, train_job
from helpers_models import make_recipe, stage_context
from helpers_tokenizer import completion_record, tokenizer_dir
from openai_server import Script, ScriptedOpenAIServer, expected_reply
from test_generate_resume import child as generate_once

from dflashx.data.jsonl import ShardWriter, iter_shards, shard_path, shard_paths, write_jsonl_atomic
from dflashx.dflash import checkpoint as ckpt
from dflashx.dflash.trainer import run_training
from dflashx.plan.context import build_context
from dflashx.plan.context import Estimates
from dflashx.plan.plan import StagePlan
from dflashx.resolve import resolve
from dflashx.stages import tokenize as tokenize_stage
from dflashx.stages.base import StageFailed
from dflashx.stages.generate import _still_needed
from dflashx.store import diskspace
from dflashx.store.atomic import replace_dir
from dflashx.store.diskspace import DiskFull, is_disk_full, stop_when_full
from dflashx.store.hashing import digest_path
from dflashx.targets.registry import lookup

RESUME = "run the same command again: it resumes"


class FakeDisk:
    """The disk holding `root` has `room` bytes left (None: plenty); see the module docstring."""

    def __init__(self, monkeypatch, root: Path, room: int | None = None):
        from fsspec.implementations.local import LocalFileOpener

        self.root, self.room, self.written = os.path.realpath(root), room, 0
        real_write, real_fs_write, real_save = os.write, LocalFileOpener.write, torch.save

        def write(fd, data):
            if not self._under(f"/proc/self/fd/{fd}"):
                return real_write(fd, data)
            if not (n := self._take(len(data))):
                raise full()
            return real_write(fd, bytes(memoryview(data)[:n]))  # a short write, as on a nearly full disk

        def fs_write(opener, data):
            if not self._under(opener.path):
                return real_fs_write(opener, data)
            view = memoryview(data)
            n = self._take(len(view))
            real_fs_write(opener, view[:n])
            if n < len(view):
                raise full()
            return n

        def save(obj, f, *args, **kwargs):
            if not isinstance(f, (str, os.PathLike)) or not self._under(f):
                return real_save(obj, f, *args, **kwargs)
            real_save(obj, buf := io.BytesIO(), *args, **kwargs)
            Path(f).write_bytes(buf.getvalue()[:(n := self._take(len(buf.getvalue())))])
            if n < len(buf.getvalue()):
                raise full(str(f))

        monkeypatch.setattr(os, "write", write)
        monkeypatch.setattr(LocalFileOpener, "write", fs_write)
        monkeypatch.setattr(torch, "save", save)

    def _under(self, path) -> bool:
        return os.path.realpath(path).startswith(self.root + os.sep)

    def _take(self, n: int) -> int:
        k = n if self.room is None else min(n, self.room)
        self.written, self.room = self.written + k, None if self.room is None else self.room - k
        return k


def full(*where: str) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), *where)


@pytest.fixture
def small_fs(tmp_path):
    """`mount(size) -> folder` on a real tmpfs of that size; `resize(folder, size)` frees space."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        where = tmp_path / f"small{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True) if shutil.which("mount") else None
        if done is None or done.returncode:
            why = done.stderr.strip() if done else "no mount"
            pytest.skip(f"a real small file system needs root mount privileges: {why}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def resize(where: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(where)], check=True)


def assert_stop_message(message: str, folder: Path) -> None:
    assert str(folder) in message and "free there now" in message and "needed" in message and RESUME in message


def test_what_counts_as_a_full_disk(tmp_path, monkeypatch):
    assert all(is_disk_full(e) for e in (full(), OSError(errno.EDQUOT, "Disk quota exceeded"), RuntimeError(
        "Error while serializing: I/O error: No space left on device (os error 28)")))  # safetensors' words
    wrapped = ValueError("a library's own error")
    wrapped.__cause__ = full()
    assert is_disk_full(wrapped)
    opaque = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")  # torch.save
    assert not is_disk_full(opaque, tmp_path) and not is_disk_full(OSError(errno.EIO, "I/O error"))
    monkeypatch.setattr(diskspace.shutil, "disk_usage", lambda p: SimpleNamespace(total=10, used=10, free=0))
    assert is_disk_full(opaque, tmp_path)  # any failure with nothing free is the disk


def test_stop_when_full_cleans_up_and_names_folder_and_space(tmp_path):
    cleaned = []
    with pytest.raises(DiskFull) as stop, stop_when_full(tmp_path, "a thing", needed=lambda: 3 << 20,
                                                         cleanup=lambda: cleaned.append(1)):
        raise full()
    assert cleaned == [1]
    assert_stop_message(str(stop.value), tmp_path)
    assert "about 3.0 MiB needed" in str(stop.value) and "writing a thing" in str(stop.value)
    with pytest.raises(KeyError), stop_when_full(tmp_path, "a thing", cleanup=lambda: cleaned.append(2)):
        raise KeyError("x")  # anything else passes through unchanged (after the cleanup)
    assert cleaned == [1, 2]


def test_replace_dir_puts_the_old_folder_back_when_the_new_one_cannot_go_in(tmp_path, monkeypatch):
    for folder in ("old", "new"):
        (tmp_path / folder).mkdir()
    (tmp_path / "old" / "f").write_text("old")
    real, calls = os.replace, []

    def replace(src, dst):  # the second rename (the new folder into place) finds the disk full
        calls.append(src)
        if len(calls) == 2:
            raise full()
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError):
        replace_dir(tmp_path / "new", tmp_path / "old")
    assert (tmp_path / "old" / "f").read_text() == "old" and (tmp_path / "new").is_dir()


def _prompts(run_dir: Path, n: int = 60) -> list[dict]:
    rows = [{"id": f"id{i:04d}", "source": "s", "messages": [{"role": "user", "content": f"prompt {i}"}]}
            for i in range(n)]
    write_jsonl_atomic(run_dir / "ingest" / "prompts" / "shard-00000.jsonl", rows)
    return rows


def _completions(run_dir: Path) -> dict[str, dict]:
    return {r["id"]: r for r in iter_shards(run_dir / "generate" / "completions")}


def test_generate_stops_on_a_full_disk_and_resumes_without_duplicates_or_gaps(tmp_path, monkeypatch):
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    rows = _prompts(ref_dir)
    _prompts(run_dir)
    with ScriptedOpenAIServer(Script()) as server:
        generate_once(ref_dir, server.url)  # uninterrupted
        reference = _completions(ref_dir)
        disk = FakeDisk(monkeypatch, run_dir / "generate",
                        room=sum(len(json.dumps(r)) for r in reference.values()) // 2)
        with pytest.raises(StageFailed) as stop:
            generate_once(run_dir, server.url)
        out = run_dir / "generate" / "completions"
        assert_stop_message(str(stop.value), out)
        kept = {p: p.read_bytes() for p in shard_paths(out)}
        assert all(b.endswith(b"\n") for b in kept.values() if b)  # whole fsync'ed batches only, nothing torn
        partial = _completions(run_dir)
        assert 0 < len(partial) < len(rows) and all(partial[i] == reference[i] for i in partial)
        disk.room = None  # space freed
        generate_once(run_dir, server.url)
    assert all(p.read_bytes().startswith(b) for p, b in kept.items())  # the complete records stayed as they were
    ids = [r["id"] for r in iter_shards(out)]
    assert len(ids) == len(set(ids)) == len(rows)
    assert _completions(run_dir) == reference
    for r in reference.values():
        assert (r["reasoning"], r["answer"]) == expected_reply(r["messages"])


def test_the_generate_stop_says_what_the_plan_still_needs(tmp_path):
    (tmp_path / "shard-00000.jsonl").write_bytes(b"x" * 2048)
    planned = StagePlan("generate", True, estimates=Estimates(storage_bytes=8 << 20))
    stop = _still_needed(DiskFull(tmp_path, "records", 100), SimpleNamespace(runtime=planned))
    assert "about 8.0 MiB needed (to finish: the plan's 8.0 MiB for generate, 2.0 KiB written)" in str(stop)


def test_shard_writer_on_a_real_small_file_system(small_fs):
    where = small_fs("16k")
    records = [{"id": f"r{i:04d}", "text": "x" * 180} for i in range(200)]  # ~40 KB: far more than 16 KiB
    with pytest.raises(DiskFull) as stop, ShardWriter(where / "out", flush_every=7) as w:
        for r in records:
            w.write(r)
    assert_stop_message(str(stop.value), where / "out")
    written = [r["id"] for r in iter_shards(where / "out")]
    assert written and len(written) % 7 == 0 and written == [r["id"] for r in records[:len(written)]]
    resize(where, "1m")
    with ShardWriter(where / "out", flush_every=7) as w:
        assert w.truncated_bytes == 0 and w.resumed == len(written)
        for r in records:
            w.write(r)
    assert list(iter_shards(where / "out")) == records


def test_tokenize_stops_on_a_full_disk_keeps_the_old_dataset_and_resumes(tmp_path, monkeypatch):
    tok = tokenizer_dir(str(tmp_path / "tok"))
    rng = random.Random(5)
    records = [completion_record(rng, i) for i in range(120)]
    write_jsonl_atomic(shard_path(tmp_path / "old", 0), records[:30])
    write_jsonl_atomic(shard_path(tmp_path / "all", 0), records)
    recipe = make_recipe(target={"model": str(tok), "tokenizer": str(tok), "precision": "fp32"},
                         drafter={"block_size": 8},
                         stages={"tokenize": {"max_length": 256, "num_proc": 1, "shard_size": 40}})

    def tokenize(run_dir: Path, source: str) -> Path:
        tokenize_stage.run(stage_context("tokenize", recipe, run_dir, {"generate.completions": tmp_path / source}))
        return run_dir / "tokenize" / "dataset"

    disk = FakeDisk(monkeypatch, tmp_path / "ref")
    reference = digest_path(tokenize(tmp_path / "ref", "all")).sha256  # uninterrupted; `disk` counts its bytes
    old = digest_path(tokenize(tmp_path / "run", "old"))
    final = tmp_path / "run" / "tokenize" / "dataset"
    disk = FakeDisk(monkeypatch, tmp_path / "run", room=disk.written - 2 * old.size)  # fills during the save
    with pytest.raises(StageFailed) as stop:
        tokenize(tmp_path / "run", "all")
    assert_stop_message(str(stop.value), tmp_path / "run" / "tokenize")
    assert digest_path(final).sha256 == old.sha256  # the last complete dataset, untouched and loadable
    assert len(load_from_disk(str(final))) > 0
    assert sorted(p.name for p in final.parent.iterdir()) == ["dataset"]  # scratch and partial save removed
    disk.room = None
    assert digest_path(tokenize(tmp_path / "run", "all")).sha256 == reference


class FakeEngine:
    """What save/load_training_state use of a DeepSpeed engine: a state file per tag."""

    def __init__(self, value: float = 0.0):
        self.weights = torch.full((4096,), value)

    def save_checkpoint(self, save_dir, tag, client_state, save_latest):
        (Path(save_dir) / tag).mkdir(parents=True, exist_ok=True)
        torch.save({"weights": self.weights, "client": client_state}, Path(save_dir) / tag / "model_states.pt")

    def load_checkpoint(self, save_dir, tag):
        state = torch.load(Path(save_dir) / tag / "model_states.pt")
        self.weights = state["weights"]
        return str(Path(save_dir) / tag), state["client"]


def _save(ckpts: Path, step: int, loss: float | None = None, keep: int | None = None) -> str:
    return ckpt.save_training_state(FakeEngine(step), ckpts, step, {"step": step}, {"rng": step}, loss=loss, keep=keep)


def test_checkpoint_save_on_a_full_disk_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    ckpts = tmp_path / "checkpoints"
    _save(ckpts, 2), _save(ckpts, 4)
    before = digest_path(ckpts / "step-00000004").sha256
    disk = FakeDisk(monkeypatch, ckpts, room=5000)
    with pytest.raises(DiskFull) as stop:
        _save(ckpts, 6)
    assert_stop_message(str(stop.value), ckpts)
    assert "(the size of the last complete checkpoint)" in str(stop.value)
    assert ckpt.latest_tag(ckpts) == "step-00000004" and digest_path(ckpts / "step-00000004").sha256 == before
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step-00000002", "step-00000004"]
    engine = FakeEngine()
    client, rank_state = ckpt.load_training_state(engine, ckpts, 0)
    assert client == {"step": 4} and rank_state == {"rng": 4} and torch.equal(engine.weights, torch.full((4096,), 4.0))
    disk.room = None
    assert _save(ckpts, 6) == ckpt.latest_tag(ckpts) == "step-00000006"


def test_a_failed_latest_pointer_leaves_everything_and_prunes_nothing(tmp_path, monkeypatch):
    ckpts = tmp_path / "checkpoints"
    _save(ckpts, 2, 3.0, keep=1), _save(ckpts, 4, 2.0, keep=1)
    real = ckpt.atomic_write_text

    def full_at_latest(path, text):
        if Path(path).name == ckpt.LATEST:
            raise full()
        return real(path, text)

    monkeypatch.setattr(ckpt, "atomic_write_text", full_at_latest)
    with pytest.raises(DiskFull):
        _save(ckpts, 6, 1.0, keep=1)
    assert ckpt.latest_tag(ckpts) == "step-00000004"
    assert sorted(p.name for p in ckpts.glob("*step-*")) == ["step-00000004"]  # step-2 pruned earlier, no step-6


def test_keep_checkpoints_keeps_the_newest_and_the_best(tmp_path):
    for keep, left in [(None, [2, 4, 6, 8]), (1, [4, 8]), (2, [4, 6, 8]), (3, [4, 6, 8])]:
        ckpts = tmp_path / f"keep{keep}"
        for step, loss in [(2, 3.0), (4, 1.0), (6, 2.0), (8, 2.5)]:
            _save(ckpts, step, loss, keep)
        assert sorted(int(p.name[5:]) for p in ckpts.glob("step-*")) == left, keep
        assert ckpt.best_tag(ckpts) == "step-00000004" and ckpt.latest_tag(ckpts) == "step-00000008"
    ckpts = tmp_path / "unlogged"
    _save(ckpts, 2, None, 1), _save(ckpts, 4, None, 1)  # no loss logged yet: no best, the newest stays
    assert [p.name for p in ckpts.glob("step-*")] == ["step-00000004"]


def test_the_plan_stores_what_keep_checkpoints_keeps():
    def storage(**kw):
        c = build_context(resolve(seeds_recipe("rtx_pro_6000_x4", **kw), lookup("Qwen/Qwen3.6-27B")))
        term = next(t for t in c.storage.terms if t.key == "storage.checkpoints")
        return c.storage.by_artifact["train.checkpoint"], term

    two, term = storage()  # the default keeps the 2 newest + the best
    params, n = term.inputs["params"], term.inputs["checkpoints"]
    assert two == 3 * 14 * params and term.inputs["kept"] == 3 < n and "keep_checkpoints + 1" in term.formula
    every, term = storage(stages__train__keep_checkpoints=None)
    assert every == n * 14 * params and term.inputs["kept"] == n > 3
    with pytest.raises(Exception, match="keep_checkpoints"):
        seeds_recipe(stages__train__keep_checkpoints=0)


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    """The tiny target and data, and an uninterrupted run: its folder, logged losses, one state's size."""
    root = tmp_path_factory.mktemp("train")
    paths = tiny_target(root / "target"), tiny_dataset(root / "data", n=16)
    logs: dict[int, dict] = {}
    _train(paths, root / "ref", logs)
    size = digest_path(root / "ref" / "checkpoints" / "step-00000008", content=False).size
    return {"paths": paths, "ref": root / "ref", "losses": {s: m["loss"] for s, m in logs.items()}, "state_bytes": size}


def _train(paths, stage_dir: Path, logs: dict | None = None, **kw) -> None:
    """The job of test_train_deepspeed: 8 steps, a checkpoint every 2, every step logged."""
    base = {"epochs": 1, "max_steps": 8, "lr": 1e-2, "global_batch": 4, "micro_batch": 2, "zero_stage": 2,
            "anchors_per_seq": 8, "checkpoint_every": 2, "log_every": 1}
    run_training(train_job(stage_dir, paths[1], paths[0], **(base | kw)),
                 log=(lambda m, step: logs.__setitem__(step, m)) if logs is not None else None)


def _resumes_like_the_reference(training, stage: Path, keep: int | None) -> None:
    resumed: dict[int, dict] = {}
    _train(training["paths"], stage, resumed, keep_checkpoints=keep)
    assert sorted(resumed) == [5, 6, 7, 8]  # from step-4, the last complete checkpoint
    for step in resumed:
        assert resumed[step]["loss"] == pytest.approx(training["losses"][step], rel=1e-6), step
    a, b = ckpt.load_drafter(training["ref"] / "checkpoint"), ckpt.load_drafter(stage / "checkpoint")
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.slow
def test_training_stops_on_a_full_disk_and_resumes_with_identical_losses(training, tmp_path, monkeypatch):
    stage = tmp_path / "train"
    disk = FakeDisk(monkeypatch, stage / "checkpoints", room=int(2.5 * training["state_bytes"]))  # step-6 won't fit
    with pytest.raises(DiskFull) as stop:
        _train(training["paths"], stage, keep_checkpoints=1)
    assert_stop_message(str(stop.value), stage / "checkpoints")
    assert ckpt.latest_tag(stage / "checkpoints") == "step-00000004"
    assert not list((stage / "checkpoints").glob("*step-00000006"))
    disk.room = None
    _resumes_like_the_reference(training, stage, keep=1)
    logged = {s: training["losses"][s] for s in (2, 4, 6, 8)}
    best = f"step-{min(logged, key=lambda s: (logged[s], -s)):08d}"
    assert {p.name for p in (stage / "checkpoints").glob("step-*")} == {"step-00000008", best}
    assert ckpt.checkpoint_loss(stage / "checkpoints" / best) == pytest.approx(min(logged.values()))


@pytest.mark.slow
def test_training_on_a_real_small_file_system(training, small_fs):
    where = small_fs(str(int(2.4 * training["state_bytes"]) // 4096 * 4096))  # two states and the logs fit, not three
    stage = where / "train"
    with pytest.raises(DiskFull) as stop:  # torch.save on a full tmpfs: "RuntimeError: ... unexpected pos"
        _train(training["paths"], stage)
    assert_stop_message(str(stop.value), stage / "checkpoints")
    assert ckpt.latest_tag(stage / "checkpoints") == "step-00000004"
    resize(where, "64m")
    _resumes_like_the_reference(training, stage, keep=None)
