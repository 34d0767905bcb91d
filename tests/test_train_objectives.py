"""The objectives, optimizers and label sources of `stages.train`, end to end on the real DeepSpeed
engine (CPU, gloo, one process): D-PACE, Muon (DeepSpeed's built-in) at ZeRO 0, 1 and 2, the
target's argmax as labels, a linear schedule, and a killed Muon run resuming exactly."""

from __future__ import annotations

import math

import pytest
import torch

from dflashx.dflash.checkpoint import latest_tag
from dflashx.resolve.formulas import lr_factor, muon_engine_lr
from helpers_dflash import Killed, logged_training, tiny_dataset, tiny_target, train_job

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("objectives")
    return tiny_target(root / "target"), tiny_dataset(root / "data", n=16)


def _train(paths, stage_dir, kill_at=None, **kw) -> dict[int, dict]:
    target, data = paths
    base = {"epochs": 1, "max_steps": 24, "lr": 1e-2, "global_batch": 4, "micro_batch": 2, "zero_stage": 0,
            "anchors_per_seq": 8, "checkpoint_every": 4, "log_every": 4}
    return logged_training(stage_dir, data, target, kill_at, **(base | kw))


def test_dpace_with_target_labels_trains_and_differs_from_decay(paths, tmp_path):
    dpace = _train(paths, tmp_path / "dpace", loss="dpace", labels="target", optimizer="adamw")
    decay = _train(paths, tmp_path / "decay", loss="decay_ce", labels="data", optimizer="adamw")
    assert dpace[24]["loss"] < dpace[4]["loss"] - 0.1
    assert dpace[24]["acceptance_length"] > dpace[4]["acceptance_length"]
    assert dpace[24]["loss"] != pytest.approx(decay[24]["loss"], rel=1e-4)
    assert dpace[24]["tflops"] > decay[24]["tflops"] * 0.5  # its FLOPs count the target's full forward + head


def test_muon_trains_alike_at_zero_0_1_and_2(paths, tmp_path, monkeypatch):
    """DeepSpeed's Muon at every ZeRO stage the plan picks: the same losses (gradient clipping is off
    under Muon, so no stage clips the orthogonalised update), lower than AdamW's at the same lr
    after 24 steps, with each matrix shape at its AdamW-matched engine rate."""
    import deepspeed

    groups: list[list[dict]] = []
    real = deepspeed.initialize

    def spy(*args, **kwargs):
        engine, optimizer, *rest = real(*args, **kwargs)
        zero0 = kwargs["config"]["zero_optimization"]["stage"] == 0
        groups.append([{k: v for k, v in g.items() if k != "params"} | {"shapes": {tuple(p.shape) for p in g["params"]}}
                       for g in engine.optimizer.param_groups if g["params"]] if zero0 else [])
        return engine, optimizer, *rest

    monkeypatch.setattr(deepspeed, "initialize", spy)
    runs = {z: _train(paths, tmp_path / f"z{z}", optimizer="muon", zero_stage=z) for z in (0, 1, 2)}
    adamw = _train(paths, tmp_path / "adamw", optimizer="adamw")
    for step in (4, 12, 24):
        assert runs[1][step]["loss"] == pytest.approx(runs[0][step]["loss"], rel=1e-4)
        assert runs[2][step]["loss"] == pytest.approx(runs[0][step]["loss"], rel=1e-4)
    assert runs[0][24]["loss"] < runs[0][4]["loss"] - 0.3
    assert runs[0][24]["loss"] != pytest.approx(adamw[24]["loss"], rel=1e-3)
    muon = [g for g in groups[0] if g["use_muon"]]
    assert muon and all(g["momentum"] == 0.95 for g in muon)
    for g in muon:  # the engine rate of every matrix group follows its shape; 10 x lr, AdamW-matched
        (rows, cols), = g["shapes"]
        assert g["initial_lr"] == pytest.approx(muon_engine_lr(10 * 1e-2, rows, cols))
    norms = [g for g in groups[0] if not g["use_muon"]]
    assert norms and all(len(s) == 1 for g in norms for s in g["shapes"]) and norms[0]["initial_lr"] == 1e-2


def test_killed_muon_run_resumes_with_identical_losses(paths, tmp_path):
    """Muon's momentum buffers and the auxiliary AdamW's moments are in the checkpoint."""
    kw = {"optimizer": "muon", "max_steps": 8, "log_every": 1, "checkpoint_every": 4, "schedule": "linear"}
    full = _train(paths, tmp_path / "full", **kw)
    with pytest.raises(Killed):
        _train(paths, tmp_path / "killed", kill_at=6, **kw)
    assert latest_tag(tmp_path / "killed" / "checkpoints") == "step-00000004"
    resumed = _train(paths, tmp_path / "killed", **kw)
    assert sorted(resumed) == [5, 6, 7, 8]
    for step in resumed:
        assert resumed[step]["loss"] == pytest.approx(full[step]["loss"], rel=1e-6), step
        assert resumed[step]["lr"] == pytest.approx(full[step]["lr"], rel=1e-9)


def test_target_labels_are_the_full_forwards_argmax(paths):
    """`labels: target` reads the final hidden states from the same forward that taps the features:
    every supervised position gets what the target's own logits say one position earlier."""
    from dflashx.dflash.step import TrainStep
    from dflashx.dflash.trainer import build_drafter
    from helpers_dflash import load_target

    target_dir, data = paths
    model, tok = load_target(target_dir)
    job = train_job(target_dir / ".." / "stage", data, target_dir, labels="target", max_steps=2, global_batch=4,
                    micro_batch=2, zero_stage=0)
    step = TrainStep(job, model, build_drafter(job, model.config, tok), 2, torch.device("cpu"))
    ids = torch.randint(0, 200, (2, 12))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "loss_mask": torch.tensor([[0] * 4 + [1] * 8, [0] * 6 + [1] * 6])}
    features, labels = step.target_features_and_labels(batch)
    with torch.no_grad():
        best = model(input_ids=ids).logits.argmax(-1)
    mask = batch["loss_mask"].bool()
    assert torch.equal(labels[:, 1:][mask[:, 1:]], best[:, :-1][mask[:, 1:]])
    assert torch.equal(labels[~mask], ids[~mask])
    assert torch.allclose(features, step.online_features(batch))  # the same tapped layers as the early stop


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_schedules_warm_up_then_reach_zero(schedule):
    total, warmup = 100, 4
    factors = [lr_factor(schedule, s, total, warmup) for s in range(total + 1)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0] and factors[-1] == pytest.approx(0.0, abs=1e-12)
    mid = lr_factor(schedule, 52, total, warmup)
    assert mid == pytest.approx(0.5 if schedule == "linear" else 0.5 * (1 + math.cos(math.pi * 0.5)))


def test_muon_engine_rate_matches_adamw_update_rms():
    """DeepSpeed scales an orthogonal update by sqrt(max(1, rows/cols)); at the engine rate the update's
    RMS is 0.2 x the AdamW-matched rate for any shape (Moonlight's matching)."""
    for rows, cols in ((64, 256), (256, 64), (128, 128)):
        q, _ = torch.linalg.qr(torch.randn(max(rows, cols), min(rows, cols), dtype=torch.float64))
        ortho = q if rows >= cols else q.t()
        update = ortho * math.sqrt(max(1.0, rows / cols)) * muon_engine_lr(1e-3, rows, cols)
        assert float(update.pow(2).mean().sqrt()) == pytest.approx(0.2 * 1e-3, rel=1e-9)
