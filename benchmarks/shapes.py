"""Published target shapes for the benchmarks and a random target of one, built on the device in its dtype.

`SHAPES`: the layer shapes of Qwen3-32B (dense), Qwen3.6-27B (qwen3_5 text, Gated DeltaNet 3:1) and Qwen3-30B-A3B
(MoE); `TINY`: the same keys at toy sizes (`shape_of(name, tiny=True)`); `build_target(shape, layers, device,
dtype)`. Imports torch and transformers only (no trainer, no DeepSpeed): `benchmarks/batch_decode.py` runs on a
bare GPU machine with it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

_LINEAR = {"linear_conv_kernel_dim": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
           "linear_key_head_dim": 128, "linear_value_head_dim": 128}
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-32b-dense": {"model_type": "qwen3", "hidden_size": 5120, "num_attention_heads": 64,
                        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 25600,
                        "vocab_size": 151936, "mask_token_id": 151669},
    "qwen3.6-27b-hybrid": {"model_type": "qwen3_5_text", "hidden_size": 5120, "num_attention_heads": 24,
                           "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 17408,
                           "vocab_size": 248320, "mask_token_id": 248070, **_LINEAR},
    # Qwen3-30B-A3B's published config.json (Qwen/Qwen3-30B-A3B): 128 experts, 8 active, expert FFN 768;
    # run with --target-layers 48 it is the whole model (30.5B parameters, ~61 GB in bf16)
    "qwen3-30b-a3b-moe": {"model_type": "qwen3_moe", "hidden_size": 2048, "num_attention_heads": 32,
                          "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
                          "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
                          "norm_topk_prob": True, "vocab_size": 151936, "mask_token_id": 151669},
}
TINY = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
        "vocab_size": 512, "mask_token_id": 511, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16}


def shape_of(name: str, tiny: bool) -> dict[str, Any]:
    """The named shape, or (tiny) the same architecture at TINY's sizes for the keys it has."""
    shape = SHAPES[name]
    return shape | {k: v for k, v in TINY.items() if k in shape or k == "mask_token_id"} if tiny else shape


def build_target(shape: dict[str, Any], layers: int, device: str, dtype: torch.dtype) -> nn.Module:
    """A random target of `shape` with `layers` layers, built directly in `dtype` on `device` (a 30B-parameter
    target never exists in fp32: 122 GB would not leave room for the bf16 copy on one H200)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    fields = {k: v for k, v in shape.items() if k not in ("model_type", "mask_token_id")}
    common = dict(num_hidden_layers=layers, max_position_embeddings=65536, tie_word_embeddings=False, **fields)
    if shape["model_type"] == "qwen3":
        config, cls = Qwen3Config(**common), Qwen3ForCausalLM
    elif shape["model_type"] == "qwen3_moe":
        config, cls = Qwen3MoeConfig(**common), Qwen3MoeForCausalLM
    else:
        types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
        config, cls = Qwen3_5TextConfig(layer_types=types, **common), Qwen3_5ForCausalLM
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(config).to(dtype)
    finally:
        torch.set_default_dtype(default)
    return model.eval().requires_grad_(False)
