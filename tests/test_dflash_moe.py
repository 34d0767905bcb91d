"""Online training with a mixture-of-experts target (transformers' qwen3_moe, qwen3_5_moe, gpt_oss):
the tapped layers captured through their MoE blocks equal `output_hidden_states` of a plain forward,
the forward stops after the deepest tapped layer, and a few training steps run on the real
DeepSpeed engine."""

from __future__ import annotations

import pytest
import torch

from dflashx.dflash.capture import FeatureCapture, find_decoder_layers
from dflashx.dflash.trainer import run_training
from helpers_dflash import load_target, tiny_dataset, train_job
from helpers_moe import FAMILIES, tiny_moe_target


@pytest.fixture(scope="module", params=FAMILIES)
def moe(request, tmp_path_factory):
    folder = tiny_moe_target(tmp_path_factory.mktemp(request.param), request.param)
    model, _ = load_target(folder)
    return folder, model


def test_the_target_is_a_real_mixture_of_experts(moe):
    _, model = moe
    assert all(hasattr(layer.mlp, "experts") for layer in find_decoder_layers(model))  # routed experts everywhere
    assert model.config.num_experts_per_tok == 2


def test_moe_capture_equals_hidden_states(moe):
    _, model = moe
    ids = torch.randint(10, 200, (2, 19), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # a left-padded row too
    feats = FeatureCapture(model, [0, 2]).capture(ids, mask)
    with torch.no_grad():
        hs = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert feats.shape == (2, 19, 128)
    torch.testing.assert_close(feats, torch.cat([hs[1], hs[3]], dim=-1), rtol=1e-5, atol=1e-5)


def test_moe_capture_stops_after_the_deepest_tapped_layer(moe):
    _, model = moe
    layers = find_decoder_layers(model)
    calls = [0] * len(layers)
    handles = [layer.register_forward_pre_hook(lambda m, a, i=i: calls.__setitem__(i, calls[i] + 1))
               for i, layer in enumerate(layers)]
    try:
        FeatureCapture(model, [0, 1]).capture(torch.randint(10, 200, (1, 9)))
    finally:
        for h in handles:
            h.remove()
    assert calls == [1, 1, 0, 0]


def test_mfu_counts_the_active_parameters_the_forward_runs(moe, tmp_path):
    """The FLOPs the trainer's MFU divides (`step_flops` -> `resolve.flops.target_pass_flops`, with the
    facts the trainer is given) count, per target token, 2 x the parameters a token passes through:
    every non-expert weight of layers 0..deepest and top-k / E of the routed experts' weights, read
    off the live model. The parameter term is linear in length and attention quadratic, so
    F(1) = 2a + c and F(2) = 4a + 3c give a = (3 F(1) - F(2)) / 2."""
    from dflashx.resolve.flops import target_pass_flops

    folder, model = moe
    job = train_job(tmp_path / "s", tmp_path / "d", folder, drafter={"target_layer_ids": [0, 2]})
    layers = find_decoder_layers(model)[: max(job.drafter.target_layer_ids) + 1]
    routed = sum(p.numel() for n, p in layers.named_parameters() if ".experts." in n)
    rest = sum(p.numel() for n, p in layers.named_parameters() if ".experts." not in n)
    experts = getattr(model.config, "num_experts", None) or model.config.num_local_experts
    live_active = rest + routed * model.config.num_experts_per_tok / experts

    def flops(length: int) -> float:
        return target_pass_flops(job.target.facts, job.drafter.target_layer_ids, "data", [length], 0)

    assert (3 * flops(1) - flops(2)) / 2 == pytest.approx(live_active, rel=1e-9)
    assert live_active < rest + routed  # an MoE token does not run every expert


@pytest.mark.slow
def test_training_steps_run_on_an_moe_target(moe, tmp_path):
    folder, _ = moe
    data = tiny_dataset(tmp_path / "data", n=8)
    logs: dict[int, dict] = {}
    job = train_job(tmp_path / "stage", data, folder, epochs=1, max_steps=3, lr=1e-2, global_batch=4, micro_batch=2,
                    zero_stage=2, anchors_per_seq=8, checkpoint_every=3, log_every=1)
    assert job.target.facts.model_type == moe[1].config.model_type
    run_training(job, log=lambda m, s: logs.__setitem__(s, m))
    assert sorted(logs) == [1, 2, 3]
    assert all(torch.isfinite(torch.tensor(m["loss"])) and m["tflops"] > 0 for m in logs.values())
    assert (tmp_path / "stage" / "checkpoint" / "model.safetensors").is_file()
