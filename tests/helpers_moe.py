"""Tiny random mixture-of-experts targets of the three MoE families the installed transformers has
(qwen3_moe, qwen3_5_moe with Gated DeltaNet layers, gpt_oss with sliding layers and sinks), saved
with the drafter tests' tokenizer: the layout a resolved local target has."""

from __future__ import annotations

from pathlib import Path

import torch

from dflashx.tiny.tokenizer import train_tokenizer
from helpers_dflash import TEXTS

FAMILIES = ("qwen3_moe", "qwen3_5_moe", "gpt_oss")
_SHAPE = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 16, "max_position_embeddings": 512, "tie_word_embeddings": False}


def _model(family: str, vocab: int, eos: int, pad: int):
    from transformers import (GptOssConfig, GptOssForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig,
                              Qwen3MoeConfig, Qwen3MoeForCausalLM)

    common = _SHAPE | {"vocab_size": vocab, "eos_token_id": eos, "pad_token_id": pad, "num_experts_per_tok": 2}
    if family == "qwen3_moe":
        return Qwen3MoeForCausalLM(Qwen3MoeConfig(**common, intermediate_size=128, moe_intermediate_size=32,
                                                  num_experts=4, norm_topk_prob=True))
    if family == "qwen3_5_moe":
        return Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(
            **common, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
            layer_types=["linear_attention", "full_attention"] * 2, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16))
    return GptOssForCausalLM(GptOssConfig(**common, intermediate_size=32, num_local_experts=4, sliding_window=8,
                                          layer_types=["sliding_attention", "full_attention"] * 2))


def tiny_moe_target(out_dir: str | Path, family: str = "qwen3_moe", seed: int = 0) -> Path:
    """A random 4-layer, hidden-64, 4-expert (top-2) `family` causal LM and its tokenizer in `out_dir`."""
    out_dir = Path(out_dir)
    tok = train_tokenizer(TEXTS, vocab_size=320, out_dir=out_dir)
    torch.manual_seed(seed)
    _model(family, len(tok), tok.eos_token_id, tok.pad_token_id).save_pretrained(out_dir)
    return out_dir
