"""Turn a Hugging Face `config.json` dict into `TargetFacts` (pure: the caller reads the file).

One `text_config` rule for every family: when a config nests its text stack in `text_config`
(qwen3_5, qwen3_5_moe multimodal wrappers), that section's keys win over the wrapper's. Then the
keys of each family transformers 5.x knows are read under their own names:
  - layer stack: `layer_types` as given, else derived from `full_attention_interval` (qwen3_5);
  - mixture of experts: `num_experts` (qwen3_moe, qwen3_5_moe) / `num_local_experts` (gpt_oss,
    mixtral) / `n_routed_experts` (deepseek, glm4_moe); `num_experts_per_tok`;
    `moe_intermediate_size`, else `intermediate_size` is the expert width (gpt_oss, mixtral);
    shared experts from `n_shared_experts` / `num_shared_experts`, else one when
    `shared_expert_intermediate_size` is set (qwen2_moe, qwen3_5_moe); dense layers from
    `mlp_only_layers`, `decoder_sparse_step` (qwen3_moe: layer i is sparse when (i+1) % step == 0)
    and `first_k_dense_replace`;
  - weight formats: `quantization_config.quant_method: mxfp4` marks MXFP4 routed experts (gpt_oss);
  - per-family weights transformers always builds (attention output gate, q/k norms, sinks, MoE
    biases, the shared-expert gate) by `model_type`, as its modeling files do.
"""

from __future__ import annotations

from typing import Any

from dflashx.targets.registry import TargetFacts

_REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")

# Weights transformers' modeling code builds for a family whatever its config says:
_GATED_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text")  # attention output gate
_QK_NORM_TYPES = ("qwen3", "qwen3_moe", "qwen3_next", *_GATED_TYPES)  # q_norm / k_norm per head
_SHARED_GATE_TYPES = ("qwen2_moe", "qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text")  # shared_expert_gate
_GPT_OSS_TYPES = ("gpt_oss",)  # attention sinks, router and expert biases


class ConfigFactsError(ValueError):
    """config.json lacks a field the planner needs."""


def text_section(config: dict[str, Any]) -> dict[str, Any]:
    """The one `text_config` rule: a nested text stack's keys win over the wrapper's."""
    text = config.get("text_config")
    if isinstance(text, dict):
        merged = {k: v for k, v in config.items() if k != "text_config"}
        merged.update(text)
        return merged
    return config


def _layer_types(cfg: dict[str, Any], num_layers: int) -> list[Any]:  # TargetFacts validates each name
    types = cfg.get("layer_types")
    if types:
        return [str(t) for t in types]
    interval = cfg.get("full_attention_interval")
    if interval and cfg.get("linear_num_value_heads"):
        return ["full_attention" if (i + 1) % int(interval) == 0 else "linear_attention" for i in range(num_layers)]
    return []


def _int(cfg: dict[str, Any], *keys: str) -> int:
    """The first of `keys` set to a truthy value, as int (0 when none is)."""
    return next((int(cfg[k]) for k in keys if cfg.get(k)), 0)


def _dense_layer_ids(cfg: dict[str, Any], num_layers: int) -> list[int]:
    step = _int(cfg, "decoder_sparse_step") or 1
    only = {int(i) for i in cfg.get("mlp_only_layers") or []}
    first = _int(cfg, "first_k_dense_replace")
    return [i for i in range(num_layers) if i in only or (i + 1) % step != 0 or i < first]


def _moe(cfg: dict[str, Any], num_layers: int, model_type: str) -> dict[str, Any]:
    experts = _int(cfg, "num_experts", "num_local_experts", "n_routed_experts")
    if not experts:
        return {}
    shared_size = _int(cfg, "shared_expert_intermediate_size")
    shared = _int(cfg, "n_shared_experts", "num_shared_experts") or (1 if shared_size else 0)
    quant = cfg.get("quantization_config") or {}
    return {
        "num_experts": experts,
        "num_experts_per_tok": _int(cfg, "num_experts_per_tok"),
        "moe_intermediate_size": _int(cfg, "moe_intermediate_size", "intermediate_size"),
        "num_shared_experts": shared,
        "shared_expert_intermediate_size": shared_size or (_int(cfg, "moe_intermediate_size") if shared else 0),
        "shared_expert_gate": model_type in _SHARED_GATE_TYPES,
        "moe_bias": model_type in _GPT_OSS_TYPES,
        "dense_layer_ids": _dense_layer_ids(cfg, num_layers),
        "expert_weight_format": "mxfp4" if quant.get("quant_method") == "mxfp4" else None,
    }


def facts_from_config(config: dict[str, Any], name: str | None = None) -> TargetFacts:
    """Build TargetFacts from a config.json dict; raises ConfigFactsError naming a missing key."""
    cfg = text_section(config)
    missing = [key for key in _REQUIRED if cfg.get(key) is None]
    layers = int(cfg.get("num_hidden_layers") or 0)
    model_type = str(cfg.get("model_type", "unknown"))
    moe = _moe(cfg, layers, model_type) if not missing else {}
    if cfg.get("intermediate_size") is None and (not moe or moe["dense_layer_ids"]):
        missing.append("intermediate_size")
    if missing:
        raise ConfigFactsError(
            f"config.json has no {', '.join(missing)}; pass a known `target.arch` or a complete config"
        )
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    mtp = cfg.get("mtp_num_hidden_layers") or cfg.get("num_nextn_predict_layers") or 0
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    return TargetFacts(
        name=name or str(cfg.get("_name_or_path") or cfg.get("model_type", "local")),
        model_type=model_type,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(cfg.get("intermediate_size") or 0),
        vocab_size=int(cfg["vocab_size"]),
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 32_768),
        layer_types=_layer_types(cfg, layers),
        attn_output_gate=bool(cfg.get("attn_output_gate", model_type in _GATED_TYPES)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        qk_norm=model_type in _QK_NORM_TYPES,
        attention_sinks=model_type in _GPT_OSS_TYPES,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        sliding_window=int(window) if window else None,
        mtp_layers=int(mtp),
        mask_token_id=cfg.get("mask_token_id"),
        linear_num_key_heads=int(cfg.get("linear_num_key_heads") or 0),
        linear_num_value_heads=int(cfg.get("linear_num_value_heads") or 0),
        linear_key_head_dim=int(cfg.get("linear_key_head_dim") or 0),
        linear_value_head_dim=int(cfg.get("linear_value_head_dim") or 0),
        linear_conv_kernel_dim=int(cfg.get("linear_conv_kernel_dim") or 0),
        **moe,
    )


MASK_TOKEN_NAMES = ("<|mask|>", "<mask>", "[MASK]")
# Reserved rows a tokenizer ships unused, by family: Llama 3's `<|reserved_special_token_0|>`,
# o200k_harmony's `<|reserved_200000|>` (gpt-oss). The lowest-id one is the pick (docs/planner.md).
RESERVED_TOKEN_PREFIXES = ("<|reserved_special_token_", "<|reserved_")


def mask_token_from_tokenizer(tokenizer_json: dict[str, Any] | None,
                              tokenizer_config: dict[str, Any] | None) -> int | None:
    """The id of a dedicated mask token (`<|mask|>`, `<mask>`, `[MASK]`) among a tokenizer's added
    tokens (tokenizer.json `added_tokens`, tokenizer_config.json `added_tokens_decoder`), else its
    lowest-id reserved special token (`<|reserved_special_token_N|>`, `<|reserved_N|>`), or None."""
    found: dict[str, int] = {}
    for token in (tokenizer_json or {}).get("added_tokens") or []:
        found.setdefault(str(token.get("content")), int(token["id"]))
    for token_id, token in ((tokenizer_config or {}).get("added_tokens_decoder") or {}).items():
        found.setdefault(str(token.get("content")), int(token_id))
    named = next((found[name] for name in MASK_TOKEN_NAMES if name in found), None)
    if named is not None:
        return named
    reserved = [i for text, i in found.items() if text.startswith(RESERVED_TOKEN_PREFIXES)]
    return min(reserved, default=None)
