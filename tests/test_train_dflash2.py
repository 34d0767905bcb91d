"""DFlash2 training on the real DeepSpeed engine (CPU, gloo): the selector loss falls on the pattern
data, a killed run resumes to identical losses (the selector ramp included), two ranks match one,
and Muon leaves the selector's codebooks and the convolutions' 3-D kernels to AdamW."""

from __future__ import annotations

import json

import pytest
import torch

from dflashx.dflash.checkpoint import latest_tag
from helpers_dflash import Killed, logged_training, tiny_dataset, tiny_target, train_job

pytestmark = pytest.mark.slow

DFLASH2 = {"architecture": "dflash2", "selector_rank": 8, "selector_top_k": 4}
SELECTOR_KEYS = {"selector_loss", "selector_accuracy", "selector_acceptance_length", "selector_gold_in_top_k",
                 "selector_weight"}



@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("dflash2")
    return tiny_target(root / "target"), tiny_dataset(root / "data", n=16)


def _train(paths, stage_dir, kill_at=None, **kw) -> dict[int, dict]:
    target, data = paths
    base = {"epochs": 1, "max_steps": 8, "lr": 1e-2, "global_batch": 4, "micro_batch": 2, "zero_stage": 2,
            "anchors_per_seq": 8, "checkpoint_every": 4, "log_every": 1, "drafter": DFLASH2}
    return logged_training(stage_dir, data, target, kill_at, **(base | kw))


def test_the_selector_loss_falls_and_is_logged(paths, tmp_path):
    logs = _train(paths, tmp_path, max_steps=32, log_every=8)
    first, last = logs[8], logs[32]
    assert last["selector_loss"] < first["selector_loss"] - 0.3
    assert last["loss"] < first["loss"] - 0.2  # the backbone trains beside it
    assert last["selector_acceptance_length"] > first["selector_acceptance_length"]
    assert len(last["selector_accuracy"]) == len(last["selector_gold_in_top_k"]) == 3
    assert last["selector_weight"] == 1.0  # past the ramp's ceil(0.04 x 32) = 2 steps
    lines = [json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert all(set(line) >= SELECTOR_KEYS for line in lines)


def test_killed_run_resumes_with_identical_losses(paths, tmp_path):
    """The ramp spans the checkpoint (6 steps of 8): a resumed engine's step count continues it."""
    full = _train(paths, tmp_path / "full", selector_warmup_ratio=0.75)
    assert [full[s]["selector_weight"] for s in (1, 5, 6, 7)] == pytest.approx([1 / 6, 5 / 6, 1.0, 1.0])
    with pytest.raises(Killed):
        _train(paths, tmp_path / "killed", kill_at=6, selector_warmup_ratio=0.75)
    assert latest_tag(tmp_path / "killed" / "checkpoints") == "step-00000004"
    resumed = _train(paths, tmp_path / "killed", selector_warmup_ratio=0.75)
    assert sorted(resumed) == [5, 6, 7, 8]
    for step in resumed:
        for key in ("loss", "selector_loss", "selector_weight"):
            assert resumed[step][key] == pytest.approx(full[step][key], rel=1e-6), (step, key)


def test_muon_leaves_codebooks_and_conv_kernels_to_adamw(paths, tmp_path):
    """The engine's Muon groups (DeepSpeed tags by name, and these names say neither embed nor lm_head):
    the codebooks and `base_kernel` [2, K, H] in AdamW groups at `lr`, every Linear weight under Muon."""
    from dflashx.dflash.step import TrainStep
    from dflashx.dflash.trainer import build_drafter
    from helpers_dflash import load_target

    target_dir, data = paths
    model, tok = load_target(target_dir)
    job = train_job(tmp_path, data, target_dir, drafter=DFLASH2, max_steps=2, global_batch=4, micro_batch=2,
                    zero_stage=0, lr=1e-2)
    drafter = build_drafter(job, model.config, tok)
    step = TrainStep(job, model, drafter, 2, torch.device("cpu"))
    muon = {id(p) for g in step.engine.optimizer.param_groups if g["use_muon"] for p in g["params"]}
    adam = {id(p): g["lr"] for g in step.engine.optimizer.param_groups if not g["use_muon"] for p in g["params"]}
    sel, conv = drafter.candidate_selector, drafter.layers[0].attention_conv
    for p in (sel.predecessor_codebook.weight, sel.successor_codebook.weight, conv.base_kernel):
        assert adam.get(id(p)) == pytest.approx(1e-2)
    linears = {id(m.weight) for m in drafter.modules() if isinstance(m, torch.nn.Linear)}
    assert {id(sel.hidden_projection.weight), id(conv.kernel_projection.weight)} <= linears
    assert muon == linears
    assert len(muon) + len(adam) == len(list(drafter.parameters()))
