"""Known target architectures: the facts the planner needs, without downloading anything.

Each entry copies its model's published config.json (the text stack); sources, mask-token picks
and published parameter counts are listed in docs/planner.md. Pure data: no torch, no I/O.
"""

from typing import Any

from dflashx.targets.target_facts import LayerType, TargetFacts

__all__ = ["ALIASES", "BUILTIN", "REGISTRY", "LayerType", "TargetFacts", "lookup"]


def _qwen3_5_types(num_layers: int, interval: int = 4) -> list[LayerType]:
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]


_QWEN3: dict[str, Any] = {"model_type": "qwen3", "vocab_size": 151_936, "max_position_embeddings": 40_960,
                          "mask_token_id": 151_669,
          "qk_norm": True}
# Qwen3 MoE (config.json of Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B): 128 experts, top-8,
# decoder_sparse_step 1 and no mlp_only_layers, so every layer is MoE; Qwen3's tokenizer.
_QWEN3_MOE: dict[str, Any] = {**_QWEN3, "model_type": "qwen3_moe", "head_dim": 128, "num_kv_heads": 4,
                              "num_experts": 128,
              "num_experts_per_tok": 8}
# gpt-oss (config.json of openai/gpt-oss-120b / -20b): 64 heads of 64, 8 KV heads, alternating
# sliding (128) / full attention from layer 0, biases, sinks, top-4 of the experts, MXFP4 experts
# (`quantization_config.quant_method: mxfp4`). Mask: <|reserved_200000|> (id 200000), the first
# reserved special token of the o200k_harmony encoding (openai/harmony
# src/tiktoken_ext/public_encodings.rs), which the harmony chat template never writes.
_GPT_OSS: dict[str, Any] = {"model_type": "gpt_oss", "hidden_size": 2880, "num_attention_heads": 64, "num_kv_heads": 8,
            "head_dim": 64, "intermediate_size": 2880, "moe_intermediate_size": 2880, "vocab_size": 201_088,
            "max_position_embeddings": 131_072, "sliding_window": 128, "attention_bias": True,
            "attention_sinks": True, "moe_bias": True, "num_experts_per_tok": 4, "expert_weight_format": "mxfp4",
            "mask_token_id": 200_000}
# Llama 3.1 / 3.3 (config.json of meta-llama/Llama-3.1-8B-Instruct, Llama-3.3-70B-Instruct):
# 128,256 vocab, 131,072 context, no thinking mode. Mask: <|reserved_special_token_0|> (id 128002,
# tokenizer_config.json `added_tokens_decoder`), a reserved row the chat template never writes.
_LLAMA3: dict[str, Any] = {"model_type": "llama", "num_kv_heads": 8, "head_dim": 128, "vocab_size": 128_256,
           "max_position_embeddings": 131_072, "thinking": False, "mask_token_id": 128_002}


def _alternating(num_layers: int) -> list[LayerType]:
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]


REGISTRY: dict[str, TargetFacts] = {
    facts.name: facts
    for facts in (
        TargetFacts(
            name="Qwen/Qwen3.6-27B", model_type="qwen3_5_text", num_layers=64, hidden_size=5120,
            num_attention_heads=24, num_kv_heads=4, head_dim=256, intermediate_size=17_408,
            vocab_size=248_320, max_position_embeddings=262_144, layer_types=_qwen3_5_types(64),
            attn_output_gate=True, qk_norm=True, mtp_layers=1, num_params=27_800_000_000, mask_token_id=248_070,
            linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
            linear_value_head_dim=128, linear_conv_kernel_dim=4,
        ),
        TargetFacts(
            name="Qwen/Qwen3-8B", num_layers=36, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
            head_dim=128, intermediate_size=12_288, num_params=8_190_000_000, **_QWEN3,
        ),
        TargetFacts(
            name="Qwen/Qwen3-32B", num_layers=64, hidden_size=5120, num_attention_heads=64, num_kv_heads=8,
            head_dim=128, intermediate_size=25_600, num_params=32_800_000_000, **_QWEN3,
        ),
        TargetFacts(
            name="Qwen/Qwen3.6-35B-A3B", model_type="qwen3_5_moe_text", num_layers=40, hidden_size=2048,
            num_attention_heads=16, num_kv_heads=2, head_dim=256, intermediate_size=0, vocab_size=248_320,
            max_position_embeddings=262_144, layer_types=_qwen3_5_types(40), attn_output_gate=True, qk_norm=True,
            mtp_layers=1, mask_token_id=248_070, num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
            num_shared_experts=1, shared_expert_intermediate_size=512, shared_expert_gate=True,
            linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
            linear_value_head_dim=128, linear_conv_kernel_dim=4,
        ),
        TargetFacts(name="Qwen/Qwen3-30B-A3B", num_layers=48, hidden_size=2048, num_attention_heads=32,
                    intermediate_size=6144, moe_intermediate_size=768, **_QWEN3_MOE),
        TargetFacts(name="Qwen/Qwen3-235B-A22B", num_layers=94, hidden_size=4096, num_attention_heads=64,
                    intermediate_size=12_288, moe_intermediate_size=1536, **_QWEN3_MOE),
        TargetFacts(name="openai/gpt-oss-120b", num_layers=36, layer_types=_alternating(36), num_experts=128,
                    **_GPT_OSS),
        TargetFacts(name="openai/gpt-oss-20b", num_layers=24, layer_types=_alternating(24), num_experts=32,
                    **_GPT_OSS),
        TargetFacts(name="meta-llama/Llama-3.1-8B-Instruct", num_layers=32, hidden_size=4096,
                    num_attention_heads=32, intermediate_size=14_336, **_LLAMA3),
        TargetFacts(name="meta-llama/Llama-3.3-70B-Instruct", num_layers=80, hidden_size=8192,
                    num_attention_heads=64, intermediate_size=28_672, **_LLAMA3),
    )
}

# Architecture aliases for `target.arch` (a local fine-tune of a known model).
ALIASES: dict[str, str] = {
    "qwen3_5-27b": "Qwen/Qwen3.6-27B",
    "qwen3.5-27b": "Qwen/Qwen3.6-27B",
    "qwen3.6-27b": "Qwen/Qwen3.6-27B",
    "Qwen/Qwen3.5-27B": "Qwen/Qwen3.6-27B",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-32b": "Qwen/Qwen3-32B",
    "qwen3.6-35b-a3b": "Qwen/Qwen3.6-35B-A3B",
    "Qwen/Qwen3.5-35B-A3B": "Qwen/Qwen3.6-35B-A3B",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "gpt-oss-120b": "openai/gpt-oss-120b",
    "gpt-oss-20b": "openai/gpt-oss-20b",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.3-70b": "meta-llama/Llama-3.3-70B-Instruct",
}

BUILTIN_PREFIX = "builtin:"


def _tiny(name: str, linear: bool) -> TargetFacts:
    """The built-in tiny targets: a copy of dflashx/tiny/build.py's VARIANTS (a test keeps them equal)."""
    extra: dict = {}
    if linear:
        extra = {"model_type": "qwen3_5_text", "layer_types": _qwen3_5_types(6, interval=3),
                 "attn_output_gate": True, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                 "linear_key_head_dim": 32, "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4}
    return TargetFacts(**{
        "name": name, "model_type": "qwen3", "num_layers": 6, "hidden_size": 192, "num_attention_heads": 6,
        "num_kv_heads": 2, "head_dim": 32, "intermediate_size": 512, "vocab_size": 1024,
        "max_position_embeddings": 1024, "layer_types": ["full_attention"] * 6, "mask_token_id": 5,
        "qk_norm": True, **extra,
    })


def _tiny_moe(name: str) -> TargetFacts:
    """tiny-qwen3 upcycled (dflashx/tiny/moe.py `moe_config`; a test keeps them equal): every layer
    4 experts of the dense MLP's width, top-2."""
    moe = {"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 512}
    return TargetFacts(**{**_tiny(name, linear=False).model_dump(), **moe})


BUILTIN: dict[str, TargetFacts] = {
    "builtin:tiny-qwen3": _tiny("builtin:tiny-qwen3", linear=False),
    "builtin:tiny-qwen3_5": _tiny("builtin:tiny-qwen3_5", linear=True),
    "builtin:tiny-qwen3_moe": _tiny_moe("builtin:tiny-qwen3_moe"),
}


def lookup(model_or_arch: str) -> TargetFacts | None:
    """Facts for an HF id, a builtin target or an architecture alias; None when unknown."""
    if model_or_arch.startswith(BUILTIN_PREFIX):
        return BUILTIN.get(model_or_arch)
    key = ALIASES.get(model_or_arch, ALIASES.get(model_or_arch.lower(), model_or_arch))
    return REGISTRY.get(key)
