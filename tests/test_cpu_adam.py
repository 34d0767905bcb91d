"""Muon's AdamW half on a CPU profile: torch's AdamW (`torch_adam`), the same update as DeepSpeed's
compiled `fused_adam` op it replaces, with no op built at run time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dflashx.config.load import load_recipe
from dflashx.plan.plan import make_plan

REPO = Path(__file__).resolve().parents[1]
LR, BETAS, EPS, WD = 5e-3, (0.9, 0.95), 1e-8, 0.1


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(n, generator=g)) for n in (64, 7, 1000)]


def _grads(step: int, params: list[torch.nn.Parameter]) -> None:
    g = torch.Generator().manual_seed(1000 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * (1 + step % 3)


def _torch_adamw(steps: int) -> list[torch.Tensor]:
    params = _params()
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, foreach=None)  # as DeepSpeed
    for step in range(steps):
        _grads(step, params)
        opt.step()
    return [p.detach().clone() for p in params]


def test_tiny_cpu_recipe_trains_muons_adam_half_with_torch():
    recipe = load_recipe(REPO / "recipes" / "tiny.yaml").recipe
    optimizer = make_plan(recipe).resolved.stages.train.deepspeed_config["optimizer"]
    assert optimizer["type"] == "Muon" and optimizer["params"]["torch_adam"] is True
    gpu = load_recipe(REPO / "recipes" / "tiny.yaml", ["hardware=h200_x1"]).recipe
    assert "torch_adam" not in make_plan(gpu).resolved.stages.train.deepspeed_config["optimizer"]["params"]


def test_torch_adamw_is_deepspeeds_adam_update():
    """DeepSpeed's own pure-torch Adam (Muon's fallback when its op is missing), decoupled decay: the
    update the compiled op computes (csrc/includes/cpu_adam_impl: bias-corrected moments, lr * wd * p)."""
    from deepspeed.runtime.zero.muon.original_muon import adam_update

    params = _params()
    state = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    for step in range(40):
        _grads(step, params)
        with torch.no_grad():
            for p, (m, v) in zip(params, state):
                update = adam_update(p.grad, m, v, step + 1, BETAS, EPS)
                p.mul_(1 - LR * WD)
                p.add_(update, alpha=-LR)
    for a, b in zip(params, _torch_adamw(40)):
        torch.testing.assert_close(a.detach(), b, rtol=1e-6, atol=1e-7)


ENGINE = """
import json, os, sys, torch, deepspeed
from dflashx.dflash.distributed import setup_distributed
from dflashx.dflash.extensions import engine_config
setup_distributed()
config = json.loads(sys.argv[1])
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
engine, *_ = deepspeed.initialize(model=model, config=engine_config(config), model_parameters=list(model.parameters()))
aux = engine.basic_optimizer.aux_optimizer
loss = model(torch.randn(1, 8)).square().mean()
engine.backward(loss)
engine.step()
root = os.environ["TORCH_EXTENSIONS_DIR"]
built = sorted(os.listdir(root)) if os.path.isdir(root) else []
print(json.dumps({"aux": type(aux).__module__ + "." + type(aux).__name__, "built": built}))
"""


def _engine(tmp_path: Path, **env: str) -> dict:
    recipe = load_recipe(REPO / "recipes" / "tiny.yaml").recipe
    config = make_plan(recipe).resolved.stages.train.deepspeed_config | {
        "train_batch_size": 1, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1}
    proc = subprocess.run([sys.executable, "-c", ENGINE, json.dumps(config)], capture_output=True, text=True,
                          env=os.environ | {"PYTHONPATH": str(REPO), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
                          | env, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_cpu_muon_engine_builds_no_op(tmp_path):
    seen = _engine(tmp_path)
    assert seen["aux"] == "torch.optim.adamw.AdamW"
    assert seen["built"] == []


COMPILED = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from dflashx.dflash.extensions import install
install()
from deepspeed.ops.adam import FusedAdam
import test_cpu_adam as t
params = t._params()
opt = FusedAdam(params, lr=t.LR, betas=t.BETAS, eps=t.EPS, weight_decay=t.WD, adam_w_mode=True)
for step in range(40):
    t._grads(step, params)
    opt.step()
torch.save([p.detach() for p in params], sys.argv[2])
"""


@pytest.mark.slow
def test_deepspeeds_compiled_cpu_adam_matches_torch_adamw(tmp_path):
    """The op the CPU profile no longer builds (about a minute of C++), built here once through
    dflashx's safe build (aside, then moved into place whole): same parameters as torch's AdamW."""
    ext = tmp_path / "ext"
    env = os.environ | {"PYTHONPATH": str(REPO), "TORCH_EXTENSIONS_DIR": str(ext), "DS_ACCELERATOR": "cpu"}
    proc = subprocess.run([sys.executable, "-c", COMPILED, str(Path(__file__).parent), str(tmp_path / "p.pt")],
                          capture_output=True, text=True, env=env, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (ext / "fused_adam" / ".dflashx-complete").exists() and not (ext / "fused_adam" / "lock").exists()
    assert list((ext / ".staging").iterdir()) == []
    for a, b in zip(torch.load(tmp_path / "p.pt"), _torch_adamw(40)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_muon_trains_the_same_with_torch_adam_as_with_the_compiled_op(tmp_path, monkeypatch):
    """The drafter's training losses under Muon, its AdamW half torch's (the CPU default now) or
    DeepSpeed's compiled `fused_adam` (the CPU default before, `DFLASHX_FUSED_ADAM=1`): the same."""
    from dflashx.dflash.extensions import COMPLETE, FUSED_ADAM_ENV
    from dflashx.dflash.trainer import run_training
    from helpers_dflash import tiny_dataset, tiny_target, train_job

    target, data = tiny_target(tmp_path / "target"), tiny_dataset(tmp_path / "data", n=16)
    kw = {"optimizer": "muon", "epochs": 1, "max_steps": 16, "lr": 1e-2, "weight_decay": 0.1, "global_batch": 4,
          "micro_batch": 2, "zero_stage": 0, "anchors_per_seq": 8, "checkpoint_every": 100, "log_every": 1}
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    losses: dict[str, dict[int, float]] = {}
    for fused in ("0", "1"):
        monkeypatch.setenv(FUSED_ADAM_ENV, fused)
        logs: dict[int, float] = {}
        run_training(train_job(tmp_path / f"fused{fused}", data, target, **kw),
                     log=lambda metrics, step, logs=logs: logs.__setitem__(step, metrics["loss"]))
        losses[fused] = logs
    assert (tmp_path / "ext" / "fused_adam" / COMPLETE).exists()  # the compiled op was built and ran
    assert sorted(losses["0"]) == list(range(1, 17))
    for step, loss in losses["0"].items():
        assert loss == pytest.approx(losses["1"][step], rel=1e-5), step
    assert losses["0"][16] < losses["0"][1]
