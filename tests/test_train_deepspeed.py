"""Training on a real DeepSpeed ZeRO-2 engine (CPU, gloo, one process): the loss falls, a killed
run resumes to exactly the same subsequent losses, and the stage writes the exported drafter.
All runs share one process so DeepSpeed's ops load once."""

from __future__ import annotations

import json
import os

import pytest
import torch

from dflashx.dflash.checkpoint import latest_tag, load_drafter
from dflashx.dflash.trainer import TrainJob, run_training
from helpers_dflash import tiny_dataset, tiny_target, train_job

pytestmark = pytest.mark.slow


class Killed(Exception):
    """Stands in for the process dying right after a step (no checkpoint taken at that step)."""


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    return tiny_target(root / "target"), tiny_dataset(root / "data", n=16)


def _job(paths, stage_dir, **kw) -> TrainJob:
    target, data = paths
    base = {"epochs": 1, "max_steps": 8, "lr": 1e-2, "global_batch": 4, "micro_batch": 2, "zero_stage": 2,
            "anchors_per_seq": 8, "checkpoint_every": 2, "log_every": 1}
    return train_job(stage_dir, data, target, **(base | kw))


def _collect(into: dict[int, dict], kill_at: int | None = None):
    def log(metrics, step):
        if step == kill_at:
            raise Killed
        into[step] = metrics
    return log


def test_zero2_training_lowers_the_loss(paths, tmp_path):
    logs: dict[int, dict] = {}
    port_before = os.environ.get("MASTER_PORT")
    run_training(_job(paths, tmp_path, max_steps=40, log_every=8), log=_collect(logs))
    # the one-rank group's port stays this process's: a `dflashx run` started from here must not reuse it
    assert os.environ.get("MASTER_PORT") == port_before
    assert logs[40]["loss"] < logs[8]["loss"] - 0.2
    assert logs[40]["acceptance_length"] > logs[8]["acceptance_length"]
    m = logs[40]
    assert len(m["accuracy"]) == 3
    assert m["tokens_per_s"] > 0 and m["tflops"] > 0 and m["mfu"] > 0 and m["memory_bytes"] > 0
    lines = (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [8, 16, 24, 32, 40]
    drafter = load_drafter(tmp_path / "checkpoint")
    assert drafter.config.target_layer_ids == [1, 2] and drafter.config.block_size == 4


def test_killed_run_resumes_with_identical_losses(paths, tmp_path):
    full: dict[int, dict] = {}
    run_training(_job(paths, tmp_path / "full"), log=_collect(full))
    first: dict[int, dict] = {}
    with pytest.raises(Killed):
        run_training(_job(paths, tmp_path / "killed"), log=_collect(first, kill_at=5))
    assert latest_tag(tmp_path / "killed" / "checkpoints") == "step-00000004"
    resumed: dict[int, dict] = {}
    run_training(_job(paths, tmp_path / "killed"), log=_collect(resumed))
    assert sorted(resumed) == [5, 6, 7, 8]
    lines = (tmp_path / "killed" / "logs" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == list(range(1, 9))  # the step logged before the kill is redone once
    for step in range(1, 5):
        assert first[step]["loss"] == pytest.approx(full[step]["loss"], rel=1e-6)
    for step in resumed:  # crosses an epoch boundary (2 steps per epoch): data position and scheduler restored
        assert resumed[step]["loss"] == pytest.approx(full[step]["loss"], rel=1e-6), step
        assert resumed[step]["lr"] == pytest.approx(full[step]["lr"], rel=1e-9)
    a, b = load_drafter(tmp_path / "full" / "checkpoint"), load_drafter(tmp_path / "killed" / "checkpoint")
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_the_engine_is_built_with_the_plans_deepspeed_config(paths, tmp_path, monkeypatch):
    """The config `dflashx plan` prints (plan.json) is the one the real engine is built with."""
    import deepspeed

    from dflashx.plan.plan import make_plan
    from helpers_dflash import job_recipe

    seen: list[dict] = []
    real = deepspeed.initialize

    def spy(*args, **kwargs):  # the real engine, with the config it was given recorded
        seen.append(json.loads(json.dumps(kwargs["config"])))
        return real(*args, **kwargs)

    monkeypatch.setattr(deepspeed, "initialize", spy)
    kw = {"max_steps": 2, "global_batch": 4, "micro_batch": 2, "zero_stage": 1, "anchors_per_seq": 8, "log_every": 1}
    run_training(_job(paths, tmp_path, **kw))
    recipe = job_recipe(paths[0], **({"epochs": 1, "lr": 1e-2, "checkpoint_every": 2} | kw))
    planned = next(s for s in make_plan(recipe, recipe.target.facts).to_json()["stages"] if s["name"] == "train")
    assert seen == [planned["deepspeed_config"]]
    assert seen[0]["gradient_accumulation_steps"] == 2 and seen[0]["zero_optimization"]["stage"] == 1


def test_offline_features_train_like_online(paths, tmp_path):
    online: dict[int, dict] = {}
    offline: dict[int, dict] = {}
    run_training(_job(paths, tmp_path / "on", max_steps=3), log=_collect(online))
    run_training(_job(paths, tmp_path / "off", max_steps=3, mode="offline"), log=_collect(offline))
    shards = list((tmp_path / "off" / "features").glob("shard-*.safetensors"))
    assert shards and (tmp_path / "off" / "features" / "done-r0-w1").exists()
    for step in (1, 2, 3):
        assert offline[step]["loss"] == pytest.approx(online[step]["loss"], rel=1e-5)


def test_init_from_continues_a_checkpoint_folder(paths, tmp_path):
    from dflashx.dflash.checkpoint import save_drafter
    from dflashx.dflash.trainer import build_drafter
    from helpers_dflash import load_target

    model, tok = load_target(paths[0])
    start = build_drafter(_job(paths, tmp_path, drafter={"num_layers": 2, "block_size": 4, "target_layer_ids": [0, 3]}),
                          model.config, tok)
    save_drafter(start, tmp_path / "public")
    cont = build_drafter(_job(paths, tmp_path, drafter={"init_from": str(tmp_path / "public")}), model.config, tok)
    assert cont.config.num_layers == 2 and cont.config.target_layer_ids == [0, 3]
    assert all(torch.equal(a, b) for a, b in zip(start.state_dict().values(), cont.state_dict().values()))
    other = model.config.to_dict() | {"hidden_size": 32, "head_dim": 8}
    with pytest.raises(ValueError, match="trained for another target"):
        build_drafter(_job(paths, tmp_path, drafter={"init_from": str(tmp_path / "public")}), other, tok)


def test_one_cpu_process_builds_no_shared_memory_op(paths, tmp_path):
    """A lone CPU rank reduces nothing: DeepSpeed's shm all-reduce op is not compiled (a minute
    of C++ on a fresh machine, the largest part of a cold `dflashx run recipes/tiny.yaml`)."""
    import subprocess
    import sys

    job = _job(paths, tmp_path / "stage", max_steps=1)
    (tmp_path / "stage").mkdir()
    job.save()
    env = os.environ | {"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "OMP_NUM_THREADS": "1"}
    env.pop("MASTER_PORT", None)
    proc = subprocess.run([sys.executable, "-m", "dflashx.dflash.trainer", "--stage-dir", str(tmp_path / "stage")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (tmp_path / "stage" / "checkpoint" / "model.safetensors").exists()
    assert not (tmp_path / "ext" / "deepspeed_shm_comm").exists()


def test_speed_switches_run_on_cpu_and_say_what_ran(paths, tmp_path):
    """Compiled layers (inductor), an FP8 drafter (torchao float8) and the liger loss asked for on CPU:
    the layers compile, float8 trains, liger (no CUDA) falls back to the torch fused loss; kernels.json
    and the returned metrics say which ran, and the loss falls."""
    logs: dict[int, dict] = {}
    last = run_training(_job(paths, tmp_path, max_steps=24, log_every=8, compile=True, loss_kernel="liger",
                             drafter={"precision": "fp8"}), log=_collect(logs))
    ran = json.loads((tmp_path / "logs" / "kernels.json").read_text())
    assert ran == last["kernels"] == {"compile": True, "attention": "sdpa", "fp8_linears": 7 + 1,
                                      "loss_kernel": "torch", "linear_attention": None, "target_sharding": "none"}
    assert logs[24]["loss"] < logs[8]["loss"]
    exported = load_drafter(tmp_path / "checkpoint").state_dict()  # float8 linears export the plain layout
    assert "layers.0.self_attn.q_proj.weight" in exported and not any("float8" in k for k in exported)


def test_compile_when_it_pays_decides_on_the_measured_eager_steps(paths, tmp_path, monkeypatch):
    """`compile: when_it_pays` (`auto` on a GPU; set here on the CPU job) trains eager, times steps 3-8 and
    compiles only when the steps left pay for a cold compile: 12 steps of a tiny drafter never do, so it stays
    eager; with the cold compile made free (the rule's constant set to 0) it compiles at step 8 and trains on.
    kernels.json says what was decided and on what figures."""
    from dflashx.resolve import compile_rule

    def job_at(folder):
        job = _job(paths, folder, max_steps=12, log_every=4)
        return job.model_copy(update={"train": job.train.model_copy(update={"compile": "when_it_pays"})})

    eager = run_training(job_at(tmp_path / "eager"))["kernels"]
    assert eager["compile"] is False and eager["compile_rule"]["pays"] is False
    assert eager["compile_rule"]["remaining_steps"] == 12 - compile_rule.DECIDE_AFTER_STEPS
    assert eager["compile_rule"]["eager_step_s"] > 0
    monkeypatch.setattr(compile_rule, "COLD_COMPILE_SECONDS", 0.0)
    logs: dict[int, dict] = {}
    compiled = run_training(job_at(tmp_path / "compiled"), log=_collect(logs))["kernels"]
    assert compiled["compile"] is True and compiled["compile_rule"]["pays"] is True
    assert json.loads((tmp_path / "compiled" / "logs" / "kernels.json").read_text()) == compiled
    assert logs[12]["loss"] < logs[4]["loss"]


def test_compile_rule_is_the_measured_trade():
    """A cold compile (20.3 s measured) against the measured 9.4% saving of a compiled step: the tiny recipe's
    350 steps of ~30 ms never pay, a 32B-shape drafter's 10,000 steps of 428 ms do; the break-even is where
    the saving equals the cold compile."""
    from dflashx.resolve.compile_rule import COLD_COMPILE_SECONDS, COMPILE_SAVING, compile_pays

    assert 0.09 < COMPILE_SAVING < 0.1
    assert not compile_pays(0.030, 350)
    assert compile_pays(0.428, 10_000)
    even = COLD_COMPILE_SECONDS / (0.1 * COMPILE_SAVING)  # steps of 0.1 s at break-even
    assert not compile_pays(0.1, int(even) - 1) and compile_pays(0.1, int(even) + 1)
