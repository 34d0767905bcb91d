"""Effective batch and optimizer steps from both sides: the trainer's real step count on a tiny
dataset (a ragged row count, fractional epochs, a global batch that is no multiple of the micro batch)
against the plan's, whose rows are the sources' prompts less the eval holdout."""

from __future__ import annotations

import pytest
from helpers_dflash import DRAFTER, tiny_dataset, tiny_target
from helpers_models import make_recipe, resolved

from dflashx.dflash.trainer import TrainJob, run_training
from dflashx.plan.plan import make_plan
from dflashx.resolve.formulas import effective_batch, optimizer_steps, steps_per_epoch

pytestmark = pytest.mark.slow

ROWS, HOLDOUT = 13, 3


def _recipe(target, **train):
    # min_loss_tokens_blocks 0: tokenize drops nothing (the plan does not predict its drops)
    return make_recipe(dataset={"sources": [{"name": "s", "path": "unused.jsonl", "expected_count": ROWS + HOLDOUT}],
                                "eval_holdout": HOLDOUT},
                       target={"model": str(target), "precision": "fp32"}, drafter=DRAFTER,
                       hardware={"name": "cpu", "cpu_tflops": 0.1},
                       stages={"tokenize": {"min_loss_tokens_blocks": 0}, "train": train})


def _plan(recipe):
    return make_plan(recipe, resolved(recipe).target.facts)  # the local folder's facts, as `dflashx plan` reads them


def _planned_steps(recipe) -> int:
    plan = _plan(recipe)
    return int(next(t for t in plan.terms if t.key == "train.steps").value)


@pytest.mark.parametrize("epochs,global_batch,micro_batch", [(1.5, 4, 2), (2, 3, 2), (1, 5, 1)])
def test_the_trainer_takes_the_steps_the_plan_counts(tmp_path, epochs, global_batch, micro_batch):
    target = tiny_target(tmp_path / "target", layers=4)
    data = tiny_dataset(tmp_path / "data", n=ROWS)
    recipe = _recipe(target, epochs=epochs, global_batch=global_batch, micro_batch=micro_batch, anchors_per_seq=4,
                     log_every=1, checkpoint_every=100)
    r = resolved(recipe)
    train = r.stages.train
    last = run_training(TrainJob.of(r, tmp_path / "stage", data, target, target))
    expected = optimizer_steps(steps_per_epoch(ROWS, train.micro_batch, train.grad_accum, 1), epochs, None)
    assert last["total_steps"] == last["step"] == expected == _planned_steps(recipe)
    # DeepSpeed's batch is the effective batch, which rounds global_batch up to whole micro batches
    assert train.deepspeed_config["train_batch_size"] == effective_batch(train.micro_batch, train.grad_accum, 1)
    assert effective_batch(train.micro_batch, train.grad_accum, 1) >= global_batch


def test_the_plan_counts_the_holdout_out(tmp_path):
    target = tiny_target(tmp_path / "target", layers=4)
    base = _plan(_recipe(target, epochs=1, global_batch=2, micro_batch=2))
    assert next(t for t in base.terms if t.key == "tokens.samples").value == ROWS  # the sources' count less the holdout
    # dataset.stats.samples is the ingest's count, the holdout already out (what a pilot measures)
    measured = _plan(make_recipe(dataset={"sources": [{"name": "s", "path": "unused.jsonl"}], "eval_holdout": HOLDOUT,
                                          "stats": {"samples": ROWS}},
                                 target={"model": str(target), "precision": "fp32"}, drafter=DRAFTER,
                                 hardware={"name": "cpu", "cpu_tflops": 0.1}))
    assert next(t for t in measured.terms if t.key == "tokens.samples").value == ROWS


def test_too_few_rows_for_one_step_is_a_plan_warning(tmp_path):
    target = tiny_target(tmp_path / "target", layers=4)
    plan = _plan(_recipe(target, global_batch=16, micro_batch=2)).to_json()
    assert any(w["code"] == "train_rows_short" and w["key"] == "stages.train.global_batch" for w in plan["warnings"])
    fits = _plan(_recipe(target, global_batch=12, micro_batch=2)).to_json()  # 13 rows fill one step of 12
    assert not any(w["code"] == "train_rows_short" for w in fits["warnings"])
