"""The frozen target in FP8 (`target.precision: fp8`) for online training and evaluation.

The target never trains, and serving runs it in FP8 anyway, so training can read its hidden states
from FP8 matrix multiplies: each `nn.Linear` of the decoder layers up to the deepest tapped one is
replaced by `FP8Linear` — weight in float8 e4m3 with one scale per output channel, activations
quantised with one scale per token on the fly, product through row-wise `torch._scaled_mm`.
Embeddings, norms, the LM head and the Gated DeltaNet recurrences stay in bf16.

On an H200 (benchmarks/train_step.py, Qwen3-32B layer shapes, 16 target layers, same run) the
row-wise version left the step's time as it was (381.4 -> 381.8 ms with an FP8 drafter) and took
peak memory from 54.6 to 47.8 GB: with 16 layers the target forward is a small part of the step;
its share, and the gain, grow with the real depth (64 layers). The weights shrink to about half,
which the planner's training-memory estimate assumes for `target.precision: fp8`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from dflashx.dflash.capture import find_decoder_layers

E4M3_MAX = 448.0  # largest finite float8_e4m3fn


def _row_scales(t: torch.Tensor) -> torch.Tensor:
    """One fp32 scale per row of a 2-D tensor, [rows, 1], mapping each row's largest |value| to 448."""
    return (t.abs().amax(dim=1, keepdim=True).float() / E4M3_MAX).clamp_min(1e-12)


class FP8Linear(nn.Module):
    """A frozen `nn.Linear` in float8 e4m3 with one scale per output channel, multiplying activations
    quantised with one scale per token (row-wise `_scaled_mm`).

    Per-token scales keep each token's output independent of the other tokens in the batch (padding
    included), so captured features do not depend on batch composition and a cached decode step
    matches a full forward.
    """

    w_scale: torch.Tensor  # buffers (register_buffer), declared for the type checker
    weight_t: torch.Tensor

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach()  # [out, in]
        scale = _row_scales(w)
        self.register_buffer("w_scale", scale.t().contiguous())  # [1, out]
        # stored transposed: _scaled_mm wants its second operand column-major
        self.register_buffer("weight_t", (w.float() / scale).to(torch.float8_e4m3fn).t())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        x_scale = _row_scales(flat)
        xq = (flat.float() / x_scale).to(torch.float8_e4m3fn)
        out = torch._scaled_mm(xq, self.weight_t, scale_a=x_scale, scale_b=self.w_scale, out_dtype=x.dtype)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8_e4m3 row-wise"


def quantize_linears(modules: Iterable[nn.Module]) -> int:
    """Swap every `nn.Linear` inside `modules` whose sizes `_scaled_mm` takes (multiples of 16) for an
    `FP8Linear`; returns how many were swapped."""
    swapped = 0
    for module in modules:
        for parent in list(module.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear) and child.in_features % 16 == 0 and child.out_features % 16 == 0:
                    setattr(parent, name, FP8Linear(child))
                    swapped += 1
    return swapped


def check_fp8(device: torch.device) -> None:
    """Raise a clear error when this device cannot multiply in FP8 with row-wise scales (CUDA needs
    compute capability 8.9 or later)."""
    try:
        a = torch.zeros(16, 16, device=device).to(torch.float8_e4m3fn)
        ones = torch.ones(16, 1, device=device)
        torch._scaled_mm(a, a.t(), scale_a=ones, scale_b=ones.t(), out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError) as e:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
        raise RuntimeError(
            f"target.precision is fp8 but {name} cannot run FP8 matrix multiplies ({e}); "
            "set target.precision: bf16 in the recipe"
        ) from e


def target_to_fp8(target: nn.Module, device: torch.device, depth: int | None = None) -> int:
    """`target.precision: fp8`: convert the linear layers of the first `depth` decoder layers (all
    when None) in place, where they are (host memory, before the move to `device`); returns how many."""
    check_fp8(device)
    layers = find_decoder_layers(target)
    return quantize_linears(layers if depth is None else layers[:depth])
