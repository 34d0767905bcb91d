"""Turn a Hugging Face `config.json` dict into `TargetFacts` (pure: the caller reads the file).

Handles plain decoder configs (qwen3, llama-like) and multimodal wrappers whose text stack sits
in a nested `text_config` (qwen3_5), including `layer_types` and the Gated DeltaNet geometry
(`linear_num_key_heads`, `linear_key_head_dim`, ...).
"""

from __future__ import annotations

from typing import Any

from dflashx.targets.registry import TargetFacts

_REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")


# transformers' qwen3_5 / qwen3_next attention always has the sigmoid output gate.
_GATED_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_next")


class ConfigFactsError(ValueError):
    """config.json lacks a field the planner needs."""


def _text_section(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config")
    if isinstance(text, dict):
        merged = {k: v for k, v in config.items() if k != "text_config"}
        merged.update(text)  # the text stack's own values win
        return merged
    return config


def _layer_types(cfg: dict[str, Any], num_layers: int) -> list[str]:
    types = cfg.get("layer_types")
    if types:
        return [str(t) for t in types]
    interval = cfg.get("full_attention_interval")
    if interval and cfg.get("linear_num_value_heads"):
        return ["full_attention" if (i + 1) % int(interval) == 0 else "linear_attention" for i in range(num_layers)]
    return []


def facts_from_config(config: dict[str, Any], name: str | None = None) -> TargetFacts:
    """Build TargetFacts from a config.json dict; raises ConfigFactsError naming a missing key."""
    cfg = _text_section(config)
    missing = [key for key in _REQUIRED if cfg.get(key) is None]
    if missing:
        raise ConfigFactsError(
            f"config.json has no {', '.join(missing)}; pass a known `target.arch` or a complete config"
        )
    layers = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    mtp = cfg.get("mtp_num_hidden_layers") or cfg.get("num_nextn_predict_layers") or 0
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    return TargetFacts(
        name=name or str(cfg.get("_name_or_path") or cfg.get("model_type", "local")),
        model_type=str(cfg.get("model_type", "unknown")),
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(cfg["intermediate_size"]),
        vocab_size=int(cfg["vocab_size"]),
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 32_768),
        layer_types=_layer_types(cfg, layers),
        attn_output_gate=bool(cfg.get("attn_output_gate", cfg.get("model_type") in _GATED_TYPES)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        sliding_window=int(window) if window else None,
        mtp_layers=int(mtp),
        mask_token_id=cfg.get("mask_token_id"),
        linear_num_key_heads=int(cfg.get("linear_num_key_heads") or 0),
        linear_num_value_heads=int(cfg.get("linear_num_value_heads") or 0),
        linear_key_head_dim=int(cfg.get("linear_key_head_dim") or 0),
        linear_value_head_dim=int(cfg.get("linear_value_head_dim") or 0),
        linear_conv_kernel_dim=int(cfg.get("linear_conv_kernel_dim") or 0),
    )


MASK_TOKEN_NAMES = ("<|mask|>", "<mask>", "[MASK]")


def mask_token_from_tokenizer(tokenizer_json: dict[str, Any] | None,
                              tokenizer_config: dict[str, Any] | None) -> int | None:
    """The id of a dedicated mask token (`<|mask|>`, `<mask>`, `[MASK]`) among a tokenizer's added
    tokens (tokenizer.json `added_tokens`, tokenizer_config.json `added_tokens_decoder`), or None."""
    found: dict[str, int] = {}
    for token in (tokenizer_json or {}).get("added_tokens") or []:
        found.setdefault(str(token.get("content")), int(token["id"]))
    for token_id, token in ((tokenizer_config or {}).get("added_tokens_decoder") or {}).items():
        found.setdefault(str(token.get("content")), int(token_id))
    return next((found[name] for name in MASK_TOKEN_NAMES if name in found), None)
