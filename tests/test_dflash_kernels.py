"""The speed switches of training (`dflashx.dflash.kernels`, the liger loss): each agrees with its plain
path where it can run, and falls back cleanly where it cannot.

CPU: torchao float8 (row-wise) drafter vs the plain one, compiled layers vs eager (inductor), the
bucketed shapes' recompiles, the missing-package errors and fallbacks. GPU (skipped without CUDA; run
on the lent H200): liger vs the torch fused loss at a real vocabulary, flash-linear-attention's Gated
DeltaNet vs transformers' torch fallback, compiled + FP8 drafter on the flex-attention path.
"""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from transformers import Qwen3Config

from dflashx.dflash.anchors import build_block_batch
from dflashx.dflash.kernels import bucketed, compile_layers, linear_attention_kernel, to_float8_training
from dflashx.dflash.masks import DraftMask
from dflashx.dflash.model import DFlashDrafter
from helpers_dflash import config_for

TARGET = Qwen3Config(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16)
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the lent H200)")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _drafter(device: str = "cpu", dtype: torch.dtype = torch.float32, **kw) -> DFlashDrafter:
    torch.manual_seed(0)
    cfg = config_for(TARGET, num_layers=2, block_size=4, target_layer_ids=[1, 2], **kw)
    return DFlashDrafter(cfg).to(device, dtype)


def _inputs(drafter: DFlashDrafter, width: int, anchors: list[int], bucket: tuple[int, int] = (1, 1), seed: int = 0):
    """Drafter inputs for one sequence of `width` tokens with these anchors, padded as the step pads."""
    cfg = drafter.config
    device, dtype = drafter.fc.weight.device, drafter.fc.weight.dtype
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 300, (1, width), generator=g)
    blocks = build_block_batch(ids, torch.ones_like(ids), [torch.tensor(anchors)], cfg.block_size, cfg.mask_token_id,
                               4.0, pad_blocks_to=bucket[1]).to(device)
    padded = bucketed(width, bucket[0])
    features = torch.randn(1, padded, cfg.k * cfg.hidden_size, generator=g).to(device, dtype)
    embeds = torch.randn(1, blocks.block_ids.shape[1], cfg.hidden_size, generator=g).to(device, dtype)
    positions = torch.arange(padded, device=device)[None]
    mask = DraftMask(blocks.anchors, padded, cfg.block_size)
    return embeds, drafter.fuse(features), blocks.block_positions, positions, mask


def _forward_backward(drafter: DFlashDrafter, inputs) -> tuple[torch.Tensor, list[torch.Tensor]]:
    drafter.zero_grad(set_to_none=True)
    out = drafter(*inputs)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.device)
    (out.float() * probe).sum().backward()  # not invariant to the final norm's scale: real gradients
    return out.detach(), [p.grad.detach().clone() for p in drafter.parameters()]


def test_fp8_drafter_agrees_with_the_plain_one_on_cpu():
    """torchao float8 row-wise on every FP8-sized linear (7 per layer + fc). e4m3 keeps 3 mantissa bits
    (up to 6% per element) and at these toy sizes (64 features, 36 tokens) little of it averages out:
    outputs agree to 5%, every gradient to 25% (relative norm; measured 1-18%)."""
    plain = _drafter()
    fp8 = copy.deepcopy(plain)
    assert to_float8_training(fp8) == 2 * 7 + 1
    assert [n for n, _ in fp8.named_parameters()] == [n for n, _ in plain.named_parameters()]  # export unchanged
    inputs = _inputs(plain, 24, [3, 9, 15])
    out, grads = _forward_backward(plain, inputs)
    out8, grads8 = _forward_backward(fp8, _inputs(fp8, 24, [3, 9, 15]))
    assert 0 < _rel(out8, out) < 0.05
    assert all(0 < _rel(a, b) < 0.25 for a, b in zip(grads8, grads))


def test_fp8_drafter_without_torchao_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # an import of it now fails, as when not installed
    with pytest.raises(RuntimeError, match=r"drafter\.precision: bf16"):
        to_float8_training(_drafter())


def test_compiled_layers_agree_with_eager():
    """inductor on CPU, fp32: outputs and gradients equal to 1e-4 (fused kernels reorder float sums)."""
    torch._dynamo.reset()
    eager = _drafter()
    compiled = copy.deepcopy(eager)
    assert compile_layers(compiled) == 2
    out, grads = _forward_backward(eager, _inputs(eager, 20, [2, 7, 11]))
    out_c, grads_c = _forward_backward(compiled, _inputs(compiled, 20, [2, 7, 11]))
    assert torch.allclose(out_c, out, atol=1e-4, rtol=1e-4)
    assert all(torch.allclose(a, b, atol=1e-4, rtol=1e-4) for a, b in zip(grads_c, grads))


def test_varying_lengths_stop_recompiling():
    """Six sequence lengths and block counts, padded to buckets (16 tokens, 4 blocks) as the step pads
    them: after the first shapes dynamo's automatic dynamic shapes compile one dynamic graph per layer
    variant (the first layer's input needs no gradient, the others' do), and the last lengths compile
    nothing new (counted with a backend that only counts and runs eagerly)."""
    torch._dynamo.reset()
    graphs: list[int] = []

    def counting(gm, _inputs):
        graphs.append(1)
        return gm.forward

    drafter = _drafter()
    for layer in drafter.layers:
        layer.compile(backend=counting)
    counts = []
    for width, anchors in [(20, [2, 7, 11]), (23, [2, 7]), (29, [3, 9, 15, 20, 25]), (61, [4, 30]), (40, [5, 12, 30]),
                           (87, [1, 44, 50, 60, 70, 80])]:
        drafter(*_inputs(drafter, width, anchors, bucket=(16, 4)))
        counts.append(len(graphs))
    assert counts[-1] == counts[-3] and counts[-1] <= 3 * 2, counts


def test_linear_attention_kernel_is_the_torch_fallback_on_cpu():
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    hybrid = Qwen3_5ForCausalLM(Qwen3_5TextConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        intermediate_size=96, vocab_size=300, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, layer_types=["linear_attention", "full_attention"]))
    dense = pytest.importorskip("transformers").Qwen3ForCausalLM(TARGET)
    assert linear_attention_kernel(hybrid) == ("fla" if torch.cuda.is_available() else "torch")
    assert linear_attention_kernel(dense) is None


@gpu
def test_liger_loss_agrees_with_the_torch_fused_loss():
    """Qwen3 vocabulary (151,936), bf16, 2,048 supervised tokens in 15 slot weights: loss to 1e-3, input
    gradient to 2e-2 (relative norm; bf16 gradients), argmax equal on >= 99.5% of tokens."""
    pytest.importorskip("liger_kernel")
    from dflashx.dflash.loss import fused_cross_entropy, liger_cross_entropy

    torch.manual_seed(0)
    n, h, v = 2048, 1024, 151936
    head = (torch.randn(v, h, device="cuda") / h**0.5).bfloat16()
    labels = torch.randint(0, v, (n,), device="cuda")
    w = torch.exp(-(torch.arange(n, device="cuda") % 15) / 7.0)
    w = w / w.sum()
    results = []
    def torch_fused(x):
        ce, pred = fused_cross_entropy(x, head, labels)
        return (ce * w).sum(), pred

    for fn in (torch_fused, lambda x: liger_cross_entropy(x, head, labels, w)):
        g = torch.Generator("cuda").manual_seed(1)
        x = torch.randn(n, h, device="cuda", generator=g).bfloat16().requires_grad_()
        loss, pred = fn(x)
        loss.backward()
        results.append((loss.detach().float(), x.grad.float(), pred))
    (la, ga, pa), (lb, gb, pb) = results
    assert abs(float(lb - la)) / float(la) < 1e-3 and _rel(gb, ga) < 2e-2
    assert (pa == pb).float().mean() >= 0.995


@gpu
def test_fla_gated_delta_rule_agrees_with_the_torch_fallback():
    """Qwen3.6-27B's Gated DeltaNet heads (48 value heads x 128), 1,024 tokens, bf16: outputs to 2e-2."""
    pytest.importorskip("fla")
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    torch.manual_seed(0)
    t, heads, d = 1024, 48, 128
    q, k, v = (torch.randn(1, t, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    g = -torch.rand(1, t, heads, device="cuda").float() * 0.1
    beta = torch.rand(1, t, heads, device="cuda").bfloat16()
    ref, _ = torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    out, _ = chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    assert _rel(out, ref) < 2e-2


@gpu
def test_compiled_fp8_drafter_on_the_flex_path():
    """CUDA, bf16, flex attention: compiled layers match eager to 2e-2, the FP8 drafter to 1e-1."""
    eager = _drafter("cuda", torch.bfloat16)
    compiled, fp8 = copy.deepcopy(eager), copy.deepcopy(eager)
    compile_layers(compiled)
    to_float8_training(fp8)
    compile_layers(fp8)
    out, _ = _forward_backward(eager, _inputs(eager, 200, [5, 60, 150], bucket=(64, 4)))
    out_c, _ = _forward_backward(compiled, _inputs(compiled, 200, [5, 60, 150], bucket=(64, 4)))
    out8, _ = _forward_backward(fp8, _inputs(fp8, 200, [5, 60, 150], bucket=(64, 4)))
    assert _rel(out_c, out) < 2e-2 and _rel(out8, out) < 1e-1
