"""The frozen target in FP8 for online training (`target.precision: fp8`).

The target never trains, and serving runs it in FP8 anyway, so training can read its hidden states
from FP8 matrix multiplies: each `nn.Linear` of the decoder layers up to the deepest tapped one is
replaced by `FP8Linear` — weight in float8 e4m3 with one per-tensor scale, activations quantised
per tensor on the fly, product through `torch._scaled_mm` accumulating in the input's dtype.
Embeddings, norms, the LM head and the Gated DeltaNet recurrences stay in bf16.

On an H200 (benchmarks/train_step.py, same run) this took the optimized step at Qwen3-32B layer
shapes from 0.400 s to 0.392 s with 16 target layers, where the drafter's work dominates; the
target's share, and the gain, grow with the real depth (64 layers). The weights shrink to about
half, which the planner's training-memory estimate assumes for `target.precision: fp8`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

E4M3_MAX = 448.0  # largest finite float8_e4m3fn


def _scale(t: torch.Tensor) -> torch.Tensor:
    return (t.abs().amax().float() / E4M3_MAX).clamp_min(1e-12)


class FP8Linear(nn.Module):
    """A frozen `nn.Linear` in float8 e4m3: per-tensor weight scale, per-tensor dynamic activation scale."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach()
        self.register_buffer("w_scale", _scale(w))
        # stored transposed: _scaled_mm wants its second operand column-major
        self.register_buffer("weight_t", (w.float() / self.w_scale).to(torch.float8_e4m3fn).t())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        x_scale = _scale(flat)
        xq = (flat.float() / x_scale).to(torch.float8_e4m3fn)
        out = torch._scaled_mm(xq, self.weight_t, scale_a=x_scale, scale_b=self.w_scale, out_dtype=x.dtype)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8_e4m3"


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
    """Raise a clear error when this device cannot multiply in FP8 (CUDA before compute capability 8.9)."""
    try:
        a = torch.zeros(16, 16, device=device).to(torch.float8_e4m3fn)
        one = torch.ones((), device=device)
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError) as e:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
        raise RuntimeError(
            f"target.precision is fp8 but {name} cannot run FP8 matrix multiplies ({e}); "
            "set target.precision: bf16 in the recipe"
        ) from e
