"""A full disk during checkpoint saves and training is a stop, not a corruption: the last complete
checkpoint stays intact, nothing is pruned after a failed save, and training resumes with the losses of an
uninterrupted run once space is freed (FakeDisk at `torch.save`; `small_fs`, a real tmpfs, where mounting
is allowed). The generate and tokenize cases are in test_disk_full.py."""


from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _plan_recipes import seeds_recipe
from helpers_disk import FakeDisk, assert_stop_message, full, resize
from helpers_dflash import tiny_dataset, tiny_target, train_job

from dflashx.dflash import checkpoint as ckpt
from dflashx.dflash.trainer import run_training
from dflashx.plan.context import build_context
from dflashx.resolve import resolve
from dflashx.store.diskspace import DiskFull
from dflashx.store.hashing import digest_path
from dflashx.targets.registry import lookup


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
