"""Online capture: layer id l equals HF hidden_states[l + 1], and the forward stops early."""

from __future__ import annotations

import pytest
import torch

from dflashx.dflash.capture import FeatureCapture, find_decoder_layers
from helpers_dflash import load_target, tiny_target


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    model, _ = load_target(tiny_target(tmp_path_factory.mktemp("target")))
    return model


def test_capture_equals_hidden_states_of_next_index(target):
    ids = torch.randint(10, 200, (2, 17))
    feats = FeatureCapture(target, [2, 0]).capture(ids)
    hs = target(ids, output_hidden_states=True).hidden_states
    assert feats.shape == (2, 17, 128)
    assert torch.allclose(feats[..., :64], hs[3]) and torch.allclose(feats[..., 64:], hs[1])


def test_capture_stops_after_the_deepest_tapped_layer(target):
    layers = find_decoder_layers(target)
    calls = [0] * len(layers)
    handles = [layer.register_forward_pre_hook(lambda m, a, i=i: calls.__setitem__(i, calls[i] + 1))
               for i, layer in enumerate(layers)]
    head_calls = []
    handles.append(target.lm_head.register_forward_pre_hook(lambda m, a: head_calls.append(1)))
    try:
        FeatureCapture(target, [0, 1]).capture(torch.randint(10, 200, (1, 9)))
    finally:
        for h in handles:
            h.remove()
    assert calls == [1, 1, 0, 0] and not head_calls
    assert not any(p.requires_grad for p in target.parameters())


def test_out_of_range_layers_are_rejected(target):
    with pytest.raises(ValueError, match="outside the target's 4 layers"):
        FeatureCapture(target, [1, 4])


HYBRID = {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
          "intermediate_size": 96, "vocab_size": 300, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
          "linear_key_head_dim": 16, "linear_value_head_dim": 16,
          "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"]}


@pytest.mark.parametrize(
    ("config_cls", "extra"),
    [("Qwen3_5TextConfig", {}),
     ("Qwen3NextConfig", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                          "shared_expert_intermediate_size": 32})],
    ids=["qwen3_5-gated-deltanet", "qwen3_next"],
)
def test_capture_on_hybrid_targets(config_cls, extra):
    import transformers
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(getattr(transformers, config_cls)(**HYBRID, **extra)).eval()
    ids = torch.randint(0, 300, (2, 11))
    feats = FeatureCapture(model, [0, 2]).capture(ids, torch.ones_like(ids))
    hs = model(ids, output_hidden_states=True).hidden_states
    assert torch.allclose(feats[..., :64], hs[1], atol=1e-5) and torch.allclose(feats[..., 64:], hs[3], atol=1e-5)


def test_recording_during_a_full_forward_keeps_the_logits(target):
    ids = torch.randint(10, 200, (1, 7))
    cap = FeatureCapture(target, [1, 3])
    with cap.recording():
        out = target(ids, output_hidden_states=True)
    assert out.logits.shape == (1, 7, target.config.vocab_size)
    assert torch.allclose(cap.features()[..., :64], out.hidden_states[2])
    assert torch.allclose(cap.capture(ids)[..., 64:], cap.features()[..., 64:])
