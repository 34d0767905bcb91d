"""Every AdamW of a training job is torch's (`torch_adam`, `dflashx.resolve.deepspeed.optimizer_config`):
AdamW's (fused on GPUs) and Muon's AdamW half (torch's default), on every profile. DeepSpeed's compiled
`fused_adam` op it replaced computed the same update; DeepSpeed's own pure-torch Adam update (Muon's inline
fallback, the update that op computes: bias-corrected moments, decoupled weight decay) is the reference
here, against torch's for-loop, foreach and fused AdamW alike (fused on this CPU: torch's CPU kernel)."""

from __future__ import annotations

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


def _torch_adamw(steps: int, **kind: bool | None) -> list[torch.Tensor]:
    params = _params()
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, **kind)
    for step in range(steps):
        _grads(step, params)
        opt.step()
    return [p.detach().clone() for p in params]


def _optimizer(*overrides: str) -> dict:
    recipe = load_recipe(REPO / "recipes" / "tiny.yaml", list(overrides)).recipe
    return make_plan(recipe).resolved.stages.train.deepspeed_config["optimizer"]


def test_every_profile_asks_for_torchs_adamw_fused_on_gpus():
    cpu_muon, gpu_muon = _optimizer(), _optimizer("hardware=h200_x1")
    assert cpu_muon["type"] == gpu_muon["type"] == "Muon"
    assert cpu_muon["params"]["torch_adam"] is gpu_muon["params"]["torch_adam"] is True
    assert "fused" not in cpu_muon["params"] and gpu_muon["params"]["fused"] is True  # the trainer applies it
    cpu, gpu = _optimizer("train.optimizer=adamw"), _optimizer("train.optimizer=adamw", "hardware=h100_x8")
    assert cpu["params"]["torch_adam"] is gpu["params"]["torch_adam"] is True
    assert "fused" not in cpu["params"] and gpu["params"]["fused"] is True


@pytest.mark.parametrize("kind", [{"foreach": False}, {"foreach": True}, {"fused": True}],
                         ids=["for-loop", "foreach", "fused"])
def test_torch_adamw_is_deepspeeds_adam_update(kind):
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
    for a, b in zip(params, _torch_adamw(40, **kind)):
        torch.testing.assert_close(a.detach(), b, rtol=1e-6, atol=1e-7)


def test_a_compiled_adams_int_steps_resume_under_torchs_adamw():
    """A training state DeepSpeed's `fused_adam` wrote keeps each step a Python int (its
    `state["step"] = group.get("step", 0)`, then `+= 1`); loaded under torch's AdamW, which now trains that
    half, the steps become tensors and training goes on as if it had never stopped."""
    from types import SimpleNamespace

    from dflashx.dflash.checkpoint import adam_steps_as_tensors

    def adamw(params: list[torch.nn.Parameter]) -> torch.optim.AdamW:
        return torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)

    params = _params()
    opt = adamw(params)
    for step in range(20):
        _grads(step, params)
        opt.step()
    resumed_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = adamw(resumed_params)
    for old, new in zip(params, resumed_params):
        state = opt.state[old]
        resumed.state[new] = {"exp_avg": state["exp_avg"].clone(), "exp_avg_sq": state["exp_avg_sq"].clone(),
                              "step": int(state["step"])}  # as fused_adam keeps it
    adam_steps_as_tensors(SimpleNamespace(basic_optimizer=SimpleNamespace(aux_optimizer=resumed)))
    assert all(torch.is_tensor(s["step"]) for s in resumed.state.values())
    for step in range(20, 40):
        for ps in (params, resumed_params):
            _grads(step, ps)
        opt.step()
        resumed.step()
    for a, b in zip(resumed_params, _torch_adamw(40)):
        torch.testing.assert_close(a.detach(), b, rtol=1e-6, atol=1e-7)
