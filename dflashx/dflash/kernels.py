"""The optional fast paths of training, each with its plain fallback, and which of them ran.

- `compile_layers(drafter)`: `torch.compile` on each drafter layer (inductor fuses the RMSNorms,
  RoPE, SwiGLU, casts and torchao's FP8 scaling around the matrix multiplies). Shapes vary with
  the data, so the step pads context lengths and block counts up to buckets (`bucketed`): a
  3072-token recipe sees at most 12 context widths, and after the first change of shape dynamo
  compiles one dynamic-shape graph (its "automatic dynamic" rule) instead of one graph per shape.
- `to_float8_training(drafter)`: `drafter.precision: fp8` — torchao's float8 training
  (`convert_to_float8_training`, row-wise scaling recipe "rowwise": e4m3 with one scale per row of
  each operand, in forward and backward) on the drafter's linear layers whose sizes FP8 matrix
  multiplies take (multiples of 16); weights and optimizer states stay in the engine's precision.
- `linear_attention_kernel()`: which Gated DeltaNet implementation a hybrid target runs —
  transformers' qwen3_5 / qwen3_next layers take flash-linear-attention's Triton kernels
  (`fla.ops.gated_delta_rule`) when the package is installed and a GPU is there, otherwise their
  torch fallback (CPU, or fla absent).

Public API: `bucketed(n, multiple)`, `compile_layers(drafter)`, `to_float8_training(drafter)`,
`linear_attention_kernel(target)`.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

import torch
from torch import nn

from dflashx.dflash.config import text_config

if TYPE_CHECKING:
    from dflashx.dflash.model import DFlashDrafter

FP8_ALIGN = 16  # FP8 matrix multiplies need both sizes of each operand to be multiples of 16


def bucketed(n: int, multiple: int) -> int:
    """n rounded up to a multiple of `multiple` (n itself for multiple 1)."""
    return -(-n // multiple) * multiple


def compile_layers(drafter: DFlashDrafter) -> int:
    """Compile each layer of `drafter.layers` in place (parameters unchanged, so an engine built
    afterwards sees the same ones); returns how many."""
    for layer in drafter.layers:
        layer.compile()
    return len(drafter.layers)


def _fp8_sized(module: nn.Module, _fqn: str) -> bool:
    return (isinstance(module, nn.Linear) and module.in_features % FP8_ALIGN == 0
            and module.out_features % FP8_ALIGN == 0)


def to_float8_training(drafter: nn.Module) -> int:
    """Swap the drafter's FP8-sized `nn.Linear`s for torchao `Float8Linear`s (row-wise scaling); the
    weights stay the same parameters. Returns how many were swapped; raises with the recipe fix when
    torchao is missing."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:
        raise RuntimeError("drafter.precision is fp8 but torchao is not installed; install dflashx[gpu] "
                           "(or `pip install torchao`), or set drafter.precision: bf16") from e
    before = sum(isinstance(m, nn.Linear) for m in drafter.modules())
    convert_to_float8_training(drafter, config=Float8LinearConfig.from_recipe_name("rowwise"),
                               module_filter_fn=_fp8_sized)
    return before - sum(type(m) is nn.Linear for m in drafter.modules())


def linear_attention_kernel(target: nn.Module) -> str | None:
    """"fla" or "torch" for a target with linear-attention (Gated DeltaNet) layers, None without any."""
    types = text_config(target.config).get("layer_types") or []
    if "linear_attention" not in types:
        return None
    fla = importlib.util.find_spec("fla") is not None and torch.cuda.is_available()
    return "fla" if fla else "torch"
