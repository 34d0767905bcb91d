"""The drafter's model states, from both sides: the planner's bytes per parameter
(`resolve.model_states`) against what a real DeepSpeed engine holds on CPU for a tiny drafter,
built with the DeepSpeed config the plan prints, for each precision, master-weights setting,
optimizer and ZeRO stage the trainer can run; and the plan's training memory following them."""

from __future__ import annotations

import pytest
import torch
from _plan_recipes import seeds_recipe
from helpers_dflash import config_for
from torch import nn

from dflashx.config.stages import TrainStage
from dflashx.dflash.distributed import setup_distributed
from dflashx.dflash.job import parameter_groups
from dflashx.dflash.model import DFlashDrafter
from dflashx.resolve.model_states import state_bytes, zero_model_state_bytes
from dflashx.plan.plan import make_plan
from dflashx.resolve.deepspeed import deepspeed_config
from dflashx.targets.registry import lookup

pytestmark = pytest.mark.slow

TARGET = {"model_type": "qwen3", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "max_position_embeddings": 512}


class SquaredWeights(nn.Module):
    """The drafter with a loss that reaches every weight (the engine's states do not depend on the loss)."""

    def __init__(self, drafter: DFlashDrafter):
        super().__init__()
        self.drafter = drafter

    def forward(self, scale: torch.Tensor) -> torch.Tensor:
        return sum((p.float() * scale).pow(2).sum() for p in self.drafter.parameters())


def _tensors(obj, seen: dict[int, int], depth: int = 0) -> None:
    """Each distinct storage reachable from `obj` (tensors in dicts, lists and tuples), by address."""
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        if storage.data_ptr():
            seen[storage.data_ptr()] = storage.nbytes()
    elif depth < 4 and isinstance(obj, dict):
        for value in list(obj.values()):
            _tensors(value, seen, depth + 1)
    elif depth < 4 and isinstance(obj, (list, tuple)):
        for value in obj:
            _tensors(value, seen, depth + 1)


def persistent_bytes(precision: str, master: str, optimizer: str, zero: int) -> tuple[float, float, float]:
    """(bytes held after two steps, matrix params, other params) of a real engine over a tiny drafter:
    the module's weights, the optimizer's master copy and its state, as DeepSpeed keeps them."""
    import deepspeed

    setup_distributed()
    torch.manual_seed(0)
    drafter = DFlashDrafter(config_for(TARGET, num_layers=1, num_target_layers=2))
    model = SquaredWeights(drafter)
    train = TrainStage(optimizer=optimizer, master_weights=master, muon_lr=1e-3)
    config = deepspeed_config(train, 1, 1, zero, 1, precision == "bf16")
    engine, optim, _, _ = deepspeed.initialize(model=model, config=config,
                                               model_parameters=parameter_groups(train, model))
    with torch._dynamo.config.patch(disable=True):  # DeepSpeed's Muon kernels uncompiled, as the CPU trainer runs
        for _ in range(2):
            engine.backward(engine(torch.tensor(1e-3)))
            engine.step()
    seen: dict[int, int] = {}
    inner = getattr(optim, "optimizer", optim)
    _tensors(list(model.parameters()), seen)
    _tensors([p for g in inner.param_groups for p in g["params"]], seen)
    _tensors(inner.state, seen)
    if optim is not inner:  # ZeRO: the flat master partitions and the staged Muon momentum live on the wrapper
        _tensors(vars(optim), seen)
    matrices = sum(p.numel() for p in model.parameters() if p.ndim >= 2)
    return float(sum(seen.values())), float(matrices), float(sum(p.numel() for p in model.parameters()) - matrices)


CASES = [
    ("bf16", "fp32", "adamw", 0), ("bf16", "fp32", "adamw", 1), ("bf16", "fp32", "adamw", 2),
    ("bf16", "bf16", "adamw", 1), ("bf16", "bf16", "adamw", 2),
    ("bf16", "fp32", "muon", 0), ("bf16", "fp32", "muon", 1), ("bf16", "bf16", "muon", 2),
    ("fp32", "fp32", "adamw", 0), ("fp32", "fp32", "adamw", 2),
    ("fp32", "fp32", "muon", 0), ("fp32", "fp32", "muon", 2),
]


@pytest.mark.parametrize("precision,master,optimizer,zero", CASES)
def test_the_engine_holds_what_the_plan_counts(precision, master, optimizer, zero):
    measured, matrices, others = persistent_bytes(precision, master, optimizer, zero)
    # under Muon the matrices get Muon and the rest (norms) DeepSpeed's auxiliary AdamW
    expected = (state_bytes(precision, master, optimizer, zero).persistent * matrices
                + state_bytes(precision, master, "adamw", zero).persistent * others)
    assert measured == pytest.approx(expected, rel=0.01)


def test_bf16_master_weights_halve_the_optimizer_side():
    fp32, bf16 = state_bytes("bf16", "fp32", "adamw", 1), state_bytes("bf16", "bf16", "adamw", 1)
    assert fp32.total == 20 and bf16.total == 10  # DeepSpeed's 2 P + 18 P / N at one rank, and half of it
    assert state_bytes("fp32", "bf16", "adamw", 1) == state_bytes("fp32", "fp32", "adamw", 1)  # fp32 drafter: no bf16
    # more partitioning never needs more memory, and one rank partitions nothing
    per_stage = [zero_model_state_bytes(1e9, s, 8, bf16) for s in range(3)]
    assert per_stage == sorted(per_stage, reverse=True)
    assert zero_model_state_bytes(1e9, 1, 1, bf16) == zero_model_state_bytes(1e9, 0, 1, bf16)


def _train_memory(**overrides) -> tuple[float, dict, str]:
    plan = make_plan(seeds_recipe("h200_x1", **overrides), lookup("Qwen/Qwen3.6-27B"))
    ctx = plan.to_json()
    train = next(s for s in ctx["stages"] if s["name"] == "train")
    params = next(t for t in plan.terms if t.key == "train.drafter_params")
    fix = next((e["fix"] for e in ctx["errors"] if e["code"] == "train_memory"), "")
    return train["estimates"]["peak_gpu_memory_bytes"], {"all": params.value, **params.inputs}, fix


@pytest.mark.parametrize("architecture", ["dflash", "dflash2"])
@pytest.mark.parametrize("optimizer,saved_per_param", [("adamw", 10), ("muon", 6)])
def test_seeds_recipe_plans_less_memory_with_bf16_master_weights(optimizer, saved_per_param, architecture):
    """h200_x1, ZeRO 1 (bf16 master weights need a ZeRO optimizer): the bytes the engine above
    measured go: AdamW 20 -> 10 per parameter, Muon 16 -> 10 (its momentum is already bf16) for the
    matrices and 20 -> 10 for what Muon leaves to AdamW (norms; DFlash2's base kernels and codebooks)."""
    same = {"stages__train__optimizer": optimizer, "stages__train__zero_stage": 1,
            "drafter__architecture": architecture}
    base, params, _ = _train_memory(**same)
    bf16, _, _ = _train_memory(**same, stages__train__master_weights="bf16")
    assert params["all"] > 1.8e9
    aux = params["adamw_params"] if optimizer == "muon" else 0
    assert base - bf16 == pytest.approx(saved_per_param * (params["all"] - aux) + 10 * aux, rel=1e-9)


def test_train_memory_fix_names_the_knobs_that_would_help():
    _, _, fix = _train_memory(stages__train__micro_batch=12)
    assert "stages.train.micro_batch" in fix and "stages.train.master_weights: bf16" in fix
    assert "stages.train.zero_stage 1 or 2" in fix  # the seeds resolve ZeRO 0 on one GPU
    assert "shard_target" not in fix  # one GPU: nothing to shard over
    _, _, fix = _train_memory(stages__train__micro_batch=12, stages__train__master_weights="bf16",
                              stages__train__zero_stage=1)
    assert "master_weights" not in fix and "stages.train.micro_batch" in fix
