"""Held-out τ while training (stages.train.tau_every): a real DeepSpeed training on CPU (gloo, one
process) decodes a held-out slice with the real speculative decoder every few steps; the τ lines are in
the JSONL log, the best-τ drafter is kept and survives a kill, the export stage exports it when it is not
the last, and the planner derives the interval from its own estimates. Nothing is mocked: the best
differs from the last because the learning rate is high enough to train past it (lr 0.5; measured:
held-out τ 1.13, 1.17, 1.15, 1.07, 1.09, 1.09 at steps 4..24)."""

from __future__ import annotations

import json

import pytest
import torch
from helpers_dflash import Killed, pattern_rows, target_and_data, train_job
from helpers_models import make_recipe, stage_context

from dflashx.dflash.checkpoint import BEST_TAU, best_tau, load_drafter
from dflashx.dflash.job import HeldOutSlice
from dflashx.dflash.tau_record import BEST_DIR, TAU_FILE, HeldOutTau, is_tau_row
from dflashx.dflash.trainer import run_training

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return target_and_data(tmp_path_factory.mktemp("tau"))


def _job(paths, stage_dir, **kw):
    target, data = paths
    base = {"epochs": 1, "max_steps": 12, "lr": 0.5, "global_batch": 4, "micro_batch": 2, "zero_stage": 0,
            "anchors_per_seq": 8, "checkpoint_every": 4, "log_every": 4, "tau_every": 4, "labels": "target"}
    job = train_job(stage_dir, data, target, **(base | kw))
    prompts = [r["input_ids"][:12] for r in pattern_rows(3, seed=7)]  # not among the training rows' starts
    train = job.train.model_copy(update={"tau_max_new_tokens": 48})
    return job.model_copy(update={"train": train, "heldout": HeldOutSlice(prompts=prompts, stop_ids=[])})


def _rows(stage_dir):
    return [json.loads(x) for x in (stage_dir / "logs" / "metrics.jsonl").read_text().splitlines()]


def _log(into, kill_at=None):
    def log(metrics, step):
        if step == kill_at and not is_tau_row(metrics):
            raise Killed
        into.append(metrics)
    return log


def _weights(folder):
    return load_drafter(folder).state_dict()


def test_tau_curve_best_kept_across_a_kill_and_training_unchanged(paths, tmp_path):
    full: list[dict] = []
    run_training(_job(paths, tmp_path / "full"), log=_log(full))
    rows = _rows(tmp_path / "full")
    taus = [r for r in rows if is_tau_row(r)]
    assert [r["step"] for r in taus] == [4, 8, 12]
    assert all(r["heldout_tau"] >= 1.0 and r["heldout_prompts"] == 3 and r["heldout_seconds"] > 0 for r in taus)
    assert [r["step"] for r in full if is_tau_row(r)] == [4, 8, 12]  # logged (records, W&B) as written
    record = HeldOutTau.read(tmp_path / "full" / "checkpoint")
    assert [p.tau for p in record.curve] == [r["heldout_tau"] for r in taus]
    assert record.best.tau == max(r["heldout_tau"] for r in taus) and record.last.step == 12
    assert best_tau(tmp_path / "full") == record.best

    # measuring forks the RNG and restores the drafter's mode: the losses are those of a run without it
    plain: list[dict] = []
    run_training(_job(paths, tmp_path / "plain", tau_every=0), log=_log(plain))
    assert not (tmp_path / "plain" / BEST_TAU).exists()
    assert HeldOutTau.read(tmp_path / "plain" / "checkpoint") is None
    assert [w["loss"] for w in plain] == pytest.approx([w["loss"] for w in full if not is_tau_row(w)], rel=1e-6)

    # killed at step 12's log (after the τ at 8 and the checkpoint at 8): resumes with the same curve, no duplicate
    with pytest.raises(Killed):
        run_training(_job(paths, tmp_path / "killed"), log=_log([], kill_at=12))
    kept = best_tau(tmp_path / "killed")
    assert kept is not None and kept.step <= 8
    # GPU kernels need not repeat a step bit for bit: a best the killed run measured after the checkpoint (at 12,
    # higher than the resumed run will) is replaced when the resumed run measures that step again
    stored = tmp_path / "killed" / BEST_TAU / TAU_FILE
    stored.write_text(kept.model_copy(update={"step": 12, "tau": 99.0}).model_dump_json())
    # and a kill between the two renames of its replacement left it aside: it is put back when read
    stored.parent.rename(stored.parent.with_name(f".{BEST_TAU}.old.tmp"))
    assert best_tau(tmp_path / "killed").tau == 99.0 and stored.is_file()
    run_training(_job(paths, tmp_path / "killed"), log=_log([]))
    assert [(r["step"], is_tau_row(r)) for r in _rows(tmp_path / "killed")] == \
        [(4, False), (4, True), (8, False), (8, True), (12, False), (12, True)]
    assert HeldOutTau.read(tmp_path / "killed" / "checkpoint") == record


def test_export_picks_the_best_tau_drafter_when_it_is_not_the_last(paths, tmp_path):
    from dflashx.stages import export as export_stage

    run_training(_job(paths, tmp_path / "train", max_steps=24))
    checkpoint = tmp_path / "train" / "checkpoint"
    record = HeldOutTau.read(checkpoint)
    assert record.exported == "best" and record.best.step < record.last.step == 24  # trained past its best
    assert record.best.tau > record.last.tau
    best = _weights(checkpoint / BEST_DIR)
    assert all(torch.equal(best[k], v) for k, v in _weights(tmp_path / "train" / BEST_TAU).items())
    assert any(not torch.equal(best[k], v) for k, v in _weights(checkpoint).items())

    recipe = make_recipe(target={"model": str(paths[0]), "precision": "fp32"}, drafter={"num_layers": 1,
                         "block_size": 4, "target_layer_ids": [1, 2]}, stages={"export": {"dtype": "fp32"}})
    (tmp_path / "run").mkdir()
    ctx = stage_context("export", recipe, tmp_path / "run", inputs={"train.checkpoint": checkpoint})
    result = export_stage.run(ctx)
    assert result.metrics["exported"] == "best"
    assert result.metrics["exported_step"] == record.best.step
    assert result.metrics["exported_heldout_tau"] == record.best.tau
    out = _weights(ctx.out_dir / result.artifacts["drafter"].path)
    assert all(torch.equal(out[k], v) for k, v in best.items())
    # the eval stage measures the drafter the export stage exports
    from dflashx.stages.eval_drafters import eval_drafters

    evaluated = eval_drafters(stage_context("eval", recipe, tmp_path / "run", inputs={"train.checkpoint": checkpoint}))
    assert evaluated[0].kind == "trained" and evaluated[0].path == checkpoint / BEST_DIR


def test_the_last_is_exported_when_only_the_last_step_is_measured(paths, tmp_path):
    run_training(_job(paths, tmp_path, max_steps=4, tau_every=100))
    record = HeldOutTau.read(tmp_path / "checkpoint")
    assert [p.step for p in record.curve] == [4] and record.exported == "last"
    assert not (tmp_path / "checkpoint" / BEST_DIR).exists()
    assert record.drafter_dir(tmp_path / "checkpoint") == tmp_path / "checkpoint"


@pytest.mark.distributed
def test_two_gloo_ranks_measure_on_rank_0_without_a_deadlock(paths, tmp_path):
    """`torchrun --nproc_per_node 2`, ZeRO 2 on gloo: rank 1 waits at the barrier while rank 0 decodes, the
    engine's collectives carry on after it, and the curve is written once; the losses are the one-rank run's
    with the same global batch (rel 1e-4, as tests/test_train_distributed.py holds them)."""
    import os
    import subprocess
    import sys

    from dflashx.dflash.distributed import free_port

    kw = {"micro_batch": 1, "zero_stage": 2, "optimizer": "adamw", "lr": 1e-2}
    one: list[dict] = []
    run_training(_job(paths, tmp_path / "one", **kw), log=_log(one))
    two = tmp_path / "two"
    two.mkdir()
    _job(paths, two, hardware={"name": "cpu-2-processes", "gpus_per_node": 2, "cpu_tflops": 0.1}, **kw).save()
    env = os.environ | {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "dflashx.dflash.trainer", "--stage-dir", str(two)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = _rows(two)
    assert [r["step"] for r in rows if is_tau_row(r)] == [4, 8, 12]
    windows = [r["loss"] for r in rows if not is_tau_row(r)]
    assert windows == pytest.approx([w["loss"] for w in one if not is_tau_row(w)], rel=1e-4)
    assert HeldOutTau.read(two / "checkpoint").curve == HeldOutTau.read(tmp_path / "one" / "checkpoint").curve
