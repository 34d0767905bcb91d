"""MoE and other families: config.json reading checked against transformers' own models (the
"both sides" test: facts' parameter counts equal `sum(p.numel())` of the instantiated tiny model),
and the registered targets against their published parameter counts."""

from __future__ import annotations

import pytest
import torch
import transformers

from dflashx.targets.read_config import ConfigFactsError, facts_from_config, mask_token_from_tokenizer
from dflashx.targets.registry import REGISTRY, lookup

_ATTN = {"vocab_size": 96, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}


def _qwen3_moe() -> transformers.PretrainedConfig:
    return transformers.Qwen3MoeConfig(**_ATTN, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=5,
                                       num_experts=6, num_experts_per_tok=2, decoder_sparse_step=2,
                                       mlp_only_layers=[3])


def _qwen3_5_moe() -> transformers.PretrainedConfig:
    text = {**_ATTN, "num_hidden_layers": 4, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24,
            "num_experts": 8, "num_experts_per_tok": 2, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4}
    return transformers.Qwen3_5MoeConfig(text_config=text)


def _gpt_oss() -> transformers.PretrainedConfig:
    return transformers.GptOssConfig(**_ATTN, intermediate_size=16, num_hidden_layers=3, num_local_experts=4,
                                     num_experts_per_tok=2)


def _llama() -> transformers.PretrainedConfig:
    return transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2)


def _qwen3() -> transformers.PretrainedConfig:
    return transformers.Qwen3Config(**_ATTN, intermediate_size=48, num_hidden_layers=2)


def _instantiate(config: transformers.PretrainedConfig) -> torch.nn.Module:
    text = getattr(config, "text_config", None) if config.model_type == "qwen3_5_moe" else None
    torch.manual_seed(0)
    if text is not None:  # the text stack alone, as the trainer loads it (no vision tower)
        return transformers.Qwen3_5MoeForCausalLM(text)
    return transformers.AutoModelForCausalLM.from_config(config)


def _routed_numel(model: torch.nn.Module) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)


@pytest.mark.parametrize("make", [_qwen3_moe, _qwen3_5_moe, _gpt_oss, _llama, _qwen3],
                         ids=["qwen3_moe", "qwen3_5_moe", "gpt_oss", "llama", "qwen3"])
def test_facts_count_every_parameter_of_the_instantiated_model(make):
    config = make()
    facts = facts_from_config(config.to_dict(), name="tiny")
    model = _instantiate(config)
    assert facts.total_params == sum(p.numel() for p in model.parameters())
    routed = _routed_numel(model)
    assert facts.routed_expert_params == routed
    if facts.is_moe:
        per_expert = routed // facts.num_moe_layers // facts.num_experts
        assert facts.active_params == facts.total_params - facts.num_moe_layers * (
            facts.num_experts - facts.num_experts_per_tok) * per_expert
    else:
        assert facts.active_params == facts.total_params and routed == 0


def test_qwen3_moe_dense_layers_follow_mlp_only_layers_and_sparse_step():
    """Layer i is sparse when it is not in mlp_only_layers and (i+1) % decoder_sparse_step == 0
    (transformers' Qwen3MoeDecoderLayer): layers 1 sparse, 0/2/3/4 dense for step 2, only [3]."""
    config = _qwen3_moe()
    facts = facts_from_config(config.to_dict())
    model = _instantiate(config)
    sparse = [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts")]
    assert [i for i in range(facts.num_layers) if facts.is_moe_layer(i)] == sparse == [1]
    assert facts.dense_layer_ids == [0, 2, 3, 4]


def test_gpt_oss_and_qwen3_5_moe_family_facts():
    oss = facts_from_config({**_gpt_oss().to_dict(), "quantization_config": {"quant_method": "mxfp4"}})
    assert (oss.model_type, oss.attention_sinks, oss.moe_bias, oss.attention_bias) == ("gpt_oss", True, True, True)
    assert oss.expert_weight_format == "mxfp4" and oss.types[:2] == ["sliding_attention", "full_attention"]
    # MXFP4 experts: 4.25 bits each, the rest at the checkpoint dtype
    assert oss.checkpoint_bytes(2) == pytest.approx(
        (oss.total_params - oss.routed_expert_params) * 2 + oss.routed_expert_params * 4.25 / 8)
    q = facts_from_config(_qwen3_5_moe().to_dict())
    assert (q.model_type, q.num_shared_experts, q.shared_expert_gate, q.intermediate_size) == (
        "qwen3_5_moe_text", 1, True, 0)
    assert q.num_linear_layers == 3 and q.attn_output_gate


def test_moe_config_without_expert_width_or_dense_width_is_named():
    cfg = {"model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2,
           "vocab_size": 10, "num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": [0],
           "moe_intermediate_size": 4}
    with pytest.raises(ConfigFactsError, match="intermediate_size"):
        facts_from_config(cfg)  # layer 0 is dense but no dense width is given
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        facts_from_config({**cfg, "intermediate_size": 8, "num_experts_per_tok": 5})


# Published total / activated counts as each model card prints them, in billions (docs/planner.md
# lists the links); a computed count lies within one unit of the printed last digit (cards round or
# truncate: Qwen3-30B-A3B prints 3.3B for 3.35B).
PUBLISHED = {
    "Qwen/Qwen3-30B-A3B": ("30.5", "3.3"),
    "Qwen/Qwen3-235B-A22B": ("235", "22"),
    "Qwen/Qwen3.6-35B-A3B": ("35", "3"),
    "openai/gpt-oss-120b": ("116.83", "5.13"),
    "openai/gpt-oss-20b": ("20.91", "3.61"),
    "meta-llama/Llama-3.1-8B-Instruct": ("8.03", "8.03"),
    "meta-llama/Llama-3.3-70B-Instruct": ("70.6", "70.6"),
}


def _rounds_to(value: float, printed: str) -> bool:
    decimals = len(printed.partition(".")[2])
    return abs(value / 1e9 - float(printed)) <= 10**-decimals


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_registered_targets_match_published_counts(name):
    """gpt-oss's card counts active parameters without the embedding table (a lookup); Qwen's and
    Llama's with it. Qwen3.6-35B-A3B's '35B' also holds its MTP layer and vision tower."""
    facts = REGISTRY[name]
    total, active = PUBLISHED[name]
    embedding_table = facts.vocab_size * facts.hidden_size if facts.model_type == "gpt_oss" else 0
    assert _rounds_to(facts.total_params, total), facts.total_params
    assert _rounds_to(facts.active_params - embedding_table, active), facts.active_params
    assert facts.mask_token_id is not None and 0 <= facts.mask_token_id < facts.vocab_size


def test_gpt_oss_120b_checkpoint_size_matches_the_published_mxfp4_checkpoint():
    """gpt-oss model card: the 120b checkpoint is 60.8 GiB (MXFP4 experts, the rest bf16)."""
    assert lookup("gpt-oss-120b").checkpoint_bytes(2) / 2**30 == pytest.approx(60.8, rel=0.02)


def test_reserved_token_is_the_mask_when_no_mask_token_exists():
    llama = {"added_tokens_decoder": {"128000": {"content": "<|begin_of_text|>"},
                                      "128003": {"content": "<|reserved_special_token_1|>"},
                                      "128002": {"content": "<|reserved_special_token_0|>"}}}
    assert mask_token_from_tokenizer(None, llama) == 128_002 == lookup("llama-3.1-8b").mask_token_id
    harmony = {"added_tokens": [{"id": 200_005, "content": "<|channel|>"},
                                {"id": 200_000, "content": "<|reserved_200000|>"}]}
    assert mask_token_from_tokenizer(harmony, None) == 200_000 == lookup("gpt-oss-20b").mask_token_id
    with_mask = {"added_tokens": [*harmony["added_tokens"], {"id": 7, "content": "<|mask|>"}]}
    assert mask_token_from_tokenizer(with_mask, None) == 7


def test_deepseek_style_keys_first_dense_layers_and_shared_experts():
    """`n_routed_experts`, `n_shared_experts` (width = the routed experts') and `first_k_dense_replace`."""
    cfg = {"model_type": "glm4_moe", "num_hidden_layers": 4, "hidden_size": 16, "num_attention_heads": 2,
           "vocab_size": 50, "intermediate_size": 40, "moe_intermediate_size": 8, "n_routed_experts": 6,
           "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1}
    facts = facts_from_config(cfg)
    assert facts.dense_layer_ids == [0] and facts.num_moe_layers == 3
    assert (facts.num_shared_experts, facts.shared_expert_intermediate_size) == (1, 8)
    assert facts.ffn_params(0) == 3 * 16 * 40
    assert facts.ffn_params(1) == 6 * 3 * 16 * 8 + 3 * 16 * 8 + 6 * 16
    assert facts.ffn_params(1, active=True) == 2 * 3 * 16 * 8 + 3 * 16 * 8 + 6 * 16
    assert facts.dense_ffn_width == 40  # the drafter takes the dense layers' width


# The text-stack keys of each model's published config.json (docs/planner.md names the sources).
PUBLISHED_CONFIGS = {
    "Qwen/Qwen3.6-35B-A3B": {
        "model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "text_config": {"model_type": "qwen3_5_moe_text", "num_hidden_layers": 40, "hidden_size": 2048,
                        "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "vocab_size": 248320,
                        "max_position_embeddings": 262144, "full_attention_interval": 4, "attn_output_gate": True,
                        "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
                        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 256,
                        "num_experts_per_tok": 8, "moe_intermediate_size": 512,
                        "shared_expert_intermediate_size": 512, "mtp_num_hidden_layers": 1,
                        "tie_word_embeddings": False},
        "vision_config": {"depth": 27}},
    "Qwen/Qwen3-30B-A3B": {
        "model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 32,
        "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "vocab_size": 151936, "max_position_embeddings": 40960, "sliding_window": None,
        "use_sliding_window": False, "tie_word_embeddings": False},
    "openai/gpt-oss-120b": {
        "model_type": "gpt_oss", "num_hidden_layers": 36, "hidden_size": 2880, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 128,
        "num_experts_per_tok": 4, "vocab_size": 201088, "max_position_embeddings": 131072, "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 18, "attention_bias": True,
        "tie_word_embeddings": False, "quantization_config": {"quant_method": "mxfp4"}},
    "meta-llama/Llama-3.1-8B-Instruct": {
        "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336, "vocab_size": 128256,
        "max_position_embeddings": 131072, "attention_bias": False, "tie_word_embeddings": False},
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_CONFIGS))
def test_registry_entries_read_like_their_published_config(name):
    """What the registry holds is what `read_config` makes of the published config.json (the mask
    token and thinking channel come from the tokenizer, not config.json)."""
    facts = facts_from_config(PUBLISHED_CONFIGS[name], name=name)
    skip = {"mask_token_id", "thinking"}
    assert facts.model_dump(exclude=skip) == REGISTRY[name].model_dump(exclude=skip)
