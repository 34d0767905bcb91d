"""The SGLang / z-lab contract for `export/drafter/config.json` (`--speculative-algorithm DFLASH`).

What SGLang's loader reads (sgl-project/sglang, `python/sglang/srt/speculative/dflash_utils.py`
`parse_dflash_draft_config` and `python/sglang/srt/models/dflash.py` `DFlashDraftModel`; the
worker's mask check in `dflash_worker.py`) and what the z-lab reference reads (z-lab/dflash
`dflash/model.py`: `config.block_size`, `config.num_target_layers`, `dflash_config.get(...)`,
`config.layer_types[i]`). Commits and the rule-by-rule table: docs/export.md.

Every architecture's config meets the shared rules here and its own (its export half's `check`: DFlash's is
causality as the engines read it). A DFlash2 config (`architectures: ["DFlash2DraftModel"]`) has DFlash2's own
(`check_dflash2`: its keys, the causality keys as vLLM 0.32.0, SGLang 0.5.23 and the reference read them, the keys
the engines read that dflashx trains without, the sizes they take from the config, the weights). It is the folder
vLLM serves DFlash2 from too, so `check_dflash2` holds vLLM's rules as well as SGLang's.

`check_sglang(config, facts, shapes=None) -> list[Violation]`, pure.
"""

from __future__ import annotations

from typing import Any, Mapping

from dflashx.config.architectures import DEFAULT, REGISTRY, architecture
from dflashx.config.architectures.spec import ArchitectureSpec
from dflashx.export.contract import (
    Violation,
    get,
    missing,
    need_block_size,
    need_equal,
    need_layer_ids,
    need_layer_stack,
    need_mask_id,
    need_weights,
)
from dflashx.export.architecture import export_half, named_by
from dflashx.export.causality import need_served, sglang_reads, trained, vllm_reads
from dflashx.targets.registry import TargetFacts

ENGINE = "SGLang"


def _one_of(config: Mapping[str, Any], key: str) -> tuple[Any, str, list[Violation]]:
    """A key SGLang reads from `dflash_config` first, then from the top level."""
    nested, top = get(config, f"dflash_config.{key}"), get(config, key)
    if not missing(nested) and not missing(top) and nested != top:
        return nested, f"dflash_config.{key}", [Violation(
            key, f"top level says {top!r}, dflash_config.{key} says {nested!r}; SGLang takes the nested one, "
            "the z-lab reference the top-level one", f"write one value (or only dflash_config.{key})")]
    return (top, key, []) if missing(nested) else (nested, f"dflash_config.{key}", [])


def causality(config: Mapping[str, Any]) -> list[Violation]:
    """The trained causality as each engine that loads this folder reads it: SGLang, then vLLM where it reads the
    folder otherwise than SGLang (else SGLang's rule speaks for both)."""
    sglang = _sglang_causality(config)
    dflash = config.get("dflash_config")
    alike = vllm_reads(config, dflash if isinstance(dflash, Mapping) else None) == sglang_reads(config)
    return sglang if sglang and alike else sglang + _vllm_causality(config)


def _sglang_causality(config: Mapping[str, Any]) -> list[Violation]:
    """SGLang serves full_attention layers bidirectional and sliding_attention layers causal
    (`_get_dflash_layer_attention_params`: ENCODER_ONLY vs DECODER); it reads no causal flag."""
    types = config.get("layer_types")
    if not isinstance(types, list) or len(types) != config.get("num_hidden_layers"):
        return []  # need_layer_stack names layer_types
    served = [t == "sliding_attention" for t in types]
    fix = ("train with the served rule (sliding layers causal, full layers bidirectional: the default "
           "when drafter.layer_types is set)")
    flags = get(config, "dflash_config.causal_layers")
    if not missing(flags):
        if flags != served:
            return [Violation("dflash_config.causal_layers", f"{flags!r} but SGLang serves {served!r} "
                              "(from layer_types)", fix)]
        return []
    causal = config.get("is_causal")
    if isinstance(causal, bool) and any(s != causal for s in served):
        return [Violation("is_causal", f"{causal} for every layer but SGLang serves {served!r} (from layer_types)",
                          fix)]
    return []


def _vllm_causality(config: Mapping[str, Any]) -> list[Violation]:
    """vLLM serves this folder too; it reads `is_causal`, else `dflash_config.causal`, for every layer
    (`export.causality`)."""
    dflash = config.get("dflash_config")
    return need_served(vllm_reads(config, dflash if isinstance(dflash, Mapping) else None), trained(config),
                       "is_causal", "vLLM", "write is_causal only when every layer is alike, and no "
                       "dflash_config.causal")


def _family(config: Mapping[str, Any], facts: TargetFacts) -> list[Violation]:
    """A recorded target family must be this target's (a drafter for qwen3_moe is not one for gpt_oss,
    even at equal shapes). Public checkpoints without the record pass; the drafter is dense either way."""
    family = get(config, "dflash_config.target_model_type")
    if missing(family):
        return []
    return need_equal(family, facts.model_type, "dflash_config.target_model_type",
                      "the drafter was trained on another target family's hidden states",
                      "train the drafter against this target (target.model)")


def _architecture(config: Mapping[str, Any]) -> tuple[ArchitectureSpec, list[Violation]]:
    """The registered architecture config.json names (its rules apply; DFlash's when it names none), and a
    violation when it names none, or names one but holds another's keys in dflash_config (the engines would build
    it without that architecture's modules)."""
    names, spec = config.get("architectures"), named_by(config)
    if spec is None:
        known = " or ".join(f'["{s.hf_name}"] (drafter.architecture: {s.name})' for s in REGISTRY.values())
        return architecture(DEFAULT), [Violation("architectures", f"{names!r}; SGLang and transformers pick the draft "
                                                 "model class from it", f"write architectures: {known}")]
    out = []
    for other in REGISTRY.values():
        held = [key for key in other.key_names() if not missing(get(config, f"dflash_config.{key}"))]
        if other is not spec and other.keys_in_config and held:
            out.append(Violation("architectures", f"{spec.hf_name} with {other.name}'s keys in dflash_config "
                                 f"({', '.join(held)}): the engines would build a {spec.name} drafter without "
                                 f"{other.name}'s modules",
                                 f'write architectures: ["{other.hf_name}"] (drafter.architecture: {other.name})'))
    return spec, out


def check_sglang(config: Mapping[str, Any], facts: TargetFacts,
                 shapes: Mapping[str, tuple[int, ...]] | None = None) -> list[Violation]:
    """Every rule of the SGLang / z-lab DFlash loader this config breaks for `facts`' target."""
    n_target = facts.num_layers
    spec, out = _architecture(config)
    out += need_equal(config.get("model_type"), "qwen3", "model_type",
                      "the drafter's layers are Qwen3 decoder layers (q/k norm, SwiGLU)", "write model_type: qwen3")
    if not isinstance(config.get("dflash_config"), Mapping):
        out.append(Violation("dflash_config", "missing or not a mapping; SGLang and the z-lab reference read the "
                             "tapped layers and the mask token from it", "write dflash_config: {...}"))
    block, block_key, clash = _one_of(config, "block_size")
    out += clash + need_block_size(block, block_key)
    count, count_key, clash = _one_of(config, "num_target_layers")
    out += clash + need_equal(count, n_target, count_key, "the target's decoder layer count; the drafter was "
                              "trained for another target", f"train for this target ({n_target} decoder layers)")
    ids = get(config, "dflash_config.target_layer_ids")
    out += need_layer_ids(ids, "dflash_config.target_layer_ids", 0, n_target,
                          f"tap layers of this target, 0-based in [0, {n_target}) (drafter.target_layer_ids; "
                          "unset: the spread over the target)")
    out += need_mask_id(get(config, "dflash_config.mask_token_id"), "dflash_config.mask_token_id", facts.vocab_size)
    token = get(config, "dflash_config.mask_token")
    if not missing(token) and (not isinstance(token, str) or not token):
        out.append(Violation("dflash_config.mask_token", f"{token!r}; SGLang needs a non-empty string",
                             "drop it or write the mask token's text"))
    out += need_layer_stack(config, "", facts.hidden_size)
    out += export_half(spec.name).check(config, facts, shapes)  # the architecture's own rules
    out += _family(config, facts)
    k = len(ids) if isinstance(ids, list) else 0
    out += need_weights(shapes, config.get("num_hidden_layers"), facts.hidden_size, k,
                        "dflash_config.target_layer_ids")
    return out

