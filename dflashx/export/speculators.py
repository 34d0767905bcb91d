"""The speculators layout of the drafter, the one vLLM serves (`export/drafter-vllm/`).

A speculators checkpoint (vllm-project/speculators) is a config.json with
`speculators_model_type: dflash`, a `speculators_config` (algorithm, proposal methods, verifier)
and the drafter's decoder-layer config under `transformer_layer_config`, next to the DFlash fields
`block_size`, `mask_token_id`, `aux_hidden_state_layer_ids`, `draft_vocab_size`,
`sliding_window_non_causal`, `sample_from_anchor`. vLLM's reader (`SpeculatorsConfig` and
`update_dflash` in `vllm/transformers_utils/configs/speculators/`) starts from
`transformer_layer_config`, takes `num_speculative_tokens` from the default proposal method and
maps `aux_hidden_state_layer_ids` back to `dflash_config.target_layer_ids = [i - 1 ...]`; it reads
every layer's causality from `sliding_window_non_causal` (`dflashx.export.causality`), so only a
drafter whose layers are all alike has a speculators form (`fits`).

Layer ids: speculators counts HF hidden states (index 0 is the embedding output), the DFlash layout
counts decoder-layer outputs, so aux id = DFlash id + 1 (speculators' own converter,
`src/speculators/convert/dflash/converter.py`, does the same). Weights keep their names: the body
(`layers.N.*`, `fc`, `hidden_norm`, `norm`) is named alike in both layouts, and vLLM's DFlash model
prefixes `model.` itself; like the z-lab checkpoints vLLM serves, the folder has no embedding or LM
head (the target's are shared). Sources and commits: docs/export.md.

Public API (pure): `to_speculators(config, verifier)`, `from_speculators(spec, num_target_layers)`,
`fits(config)`, `check_speculators(spec, facts, shapes=None, causal=None) -> list[Violation]`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from dflashx.config.architectures import dflash
from dflashx.export.architecture import export_half, named_by
from dflashx.export.causality import SLIDING, need_served, speculators_flag, trained, vllm_reads_speculators
from dflashx.export.contract import (
    Violation,
    get,
    is_int,
    missing,
    need_block_size,
    need_equal,
    need_layer_ids,
    need_layer_stack,
    need_mask_id,
    need_weights,
)
from dflashx.targets.registry import TargetFacts

MODEL_TYPE = "dflash"
ARCHITECTURE = "DFlashSpeculator"
PROPOSAL = "greedy"
ENGINE = "vLLM (speculators)"
_NOT_LAYER_KEYS = frozenset({"architectures", "auto_map", "block_size", "dflash_config", "num_target_layers",
                             "is_causal"})


def to_speculators(config: Mapping[str, Any], verifier: str,
                   verifier_architectures: tuple[str, ...] = ()) -> dict[str, Any]:
    """The speculators config.json for a DFlash-layout `config` (as `DFlashConfig.to_hf_dict()`
    writes it). The target's family travels as speculators records a verifier (`VerifierConfig.architectures`,
    by default the ones the drafter was trained against, `dflash_config.target_architectures`) and as
    a top-level `target_model_type` (`SpeculatorModelConfig` keeps extra keys: `extra="allow"`).
    Total: a broken input converts to a config the checker then names."""
    dflash = dict(config.get("dflash_config") or {})
    verifier_architectures = verifier_architectures or tuple(dflash.get("target_architectures") or ())
    block = dflash.get("block_size", config.get("block_size"))
    ids = dflash.get("target_layer_ids")
    aux = [i + 1 for i in ids] if isinstance(ids, list) and all(is_int(i) for i in ids) else ids
    layers = {k: v for k, v in config.items() if k not in _NOT_LAYER_KEYS}
    causal = trained(config)
    flag = speculators_flag(causal) if causal else None
    tokens = block - 1 if is_int(block) else None
    return {
        "architectures": [ARCHITECTURE],
        "speculators_model_type": MODEL_TYPE,
        "speculators_config": {
            "algorithm": MODEL_TYPE,
            "proposal_methods": [{"proposal_type": PROPOSAL, "speculative_tokens": tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": PROPOSAL,
            "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures)},
        },
        "transformer_layer_config": layers,
        "draft_vocab_size": config.get("vocab_size"),
        "block_size": block,
        "aux_hidden_state_layer_ids": aux,
        "mask_token_id": dflash.get("mask_token_id"),
        # vLLM reads every layer's causality from this one flag (export.causality); a drafter whose layers differ
        # has no speculators form (`fits`), and the flag then keeps vLLM's default: non-causal
        "sliding_window_non_causal": True if flag is None else flag,
        "sample_from_anchor": False,
        "target_model_type": dflash.get("target_model_type"),
        "torch_dtype": config.get("torch_dtype"),
    }


def from_speculators(spec: Mapping[str, Any], num_target_layers: int) -> dict[str, Any]:
    """The DFlash-layout config back (what `DFlashConfig.from_hf_dict` and the z-lab loader read)."""
    layers = dict(spec["transformer_layer_config"])
    types = layers.get("layer_types") or ["full_attention"] * int(layers["num_hidden_layers"])
    causal = vllm_reads_speculators({**spec, "transformer_layer_config": {**layers, "layer_types": types}})
    return {
        **layers,
        "architectures": [dflash.SPEC.hf_name],
        "block_size": spec["block_size"],
        "num_target_layers": num_target_layers,
        "dflash_config": {
            "mask_token_id": spec["mask_token_id"],
            "target_layer_ids": [i - 1 for i in spec["aux_hidden_state_layer_ids"]],
            "causal_layers": causal,
            "target_model_type": spec.get("target_model_type"),
            "target_architectures": list(spec["speculators_config"]["verifier"].get("architectures") or []),
        },
    }


def _proposal(spec: Mapping[str, Any], block: Any) -> list[Violation]:
    """vLLM drafts with the default proposal method; DFlash's block is its tokens + the anchor."""
    methods = get(spec, "speculators_config.proposal_methods")
    fix = f'write one {{"proposal_type": "{PROPOSAL}", "speculative_tokens": block_size - 1}}'
    if not isinstance(methods, list) or not methods or not all(isinstance(m, Mapping) for m in methods):
        return [Violation("speculators_config.proposal_methods", f"{methods!r}; vLLM needs a non-empty list of "
                          "mappings with a proposal_type", fix)]
    default = get(spec, "speculators_config.default_proposal_method")
    chosen = [m for m in methods if m.get("proposal_type") == default]
    if not chosen:
        return [Violation("speculators_config.default_proposal_method", f"{default!r} names none of "
                          f"{[m.get('proposal_type') for m in methods]}", f'write "{PROPOSAL}"')]
    tokens = chosen[0].get("speculative_tokens")
    if is_int(block) and not (is_int(tokens) and tokens == block - 1):
        return [Violation("speculators_config.proposal_methods[].speculative_tokens", f"{tokens!r}; a DFlash "
                          f"block of {block} drafts {block - 1} tokens after the anchor (vLLM's block is "
                          "num_speculative_tokens + 1)", fix)]
    return []


def fits(config: Mapping[str, Any]) -> bool:
    """Whether a DFlash-layout config has a speculators form vLLM reads as trained: its architecture's export half
    says (`speculators_form`; DFlash: `causality_fits`)."""
    spec = named_by(config)
    return spec is not None and export_half(spec.name).speculators_form(config)


def causality_fits(config: Mapping[str, Any]) -> bool:
    """Whether a DFlash drafter's layers' causality fits the speculators layout's one flag: all causal or all
    bidirectional (`export.causality`)."""
    causal = trained(config)
    return causal is not None and speculators_flag(causal) is not None


def _causality(spec: Mapping[str, Any], causal: Sequence[bool] | None) -> list[Violation]:
    """vLLM's reading of `sliding_window_non_causal` (one flag for every layer) must be the trained causality:
    `causal` when the caller knows it (the export's DFlash folder), else the DFlash convention (causal exactly
    where a layer slides)."""
    layers = spec.get("transformer_layer_config")
    types = layers.get("layer_types") if isinstance(layers, Mapping) else None
    wanted = list(causal) if causal is not None else (
        [t == SLIDING for t in types] if isinstance(types, list) else None)
    flag = speculators_flag(wanted) if wanted else None
    fix = (f"write sliding_window_non_causal: {str(flag).lower()}" if flag is not None else
           "serve the DFlash-layout folder with vLLM instead: a speculators config has one causality for every "
           "layer and this drafter's layers differ")
    return need_served(vllm_reads_speculators(spec), wanted, "sliding_window_non_causal", "vLLM (speculators)", fix)


def check_speculators(spec: Mapping[str, Any], facts: TargetFacts,
                      shapes: Mapping[str, tuple[int, ...]] | None = None, *,
                      causal: Sequence[bool] | None = None) -> list[Violation]:
    """Every rule of the speculators / vLLM DFlash reader this config breaks for `facts`' target; `causal`: the
    drafter's trained per-layer causality when known (else the DFlash convention is assumed)."""
    n_target, vocab = facts.num_layers, facts.vocab_size
    out = need_equal(spec.get("speculators_model_type"), MODEL_TYPE, "speculators_model_type",
                     "vLLM dispatches speculators checkpoints on it", f"write speculators_model_type: {MODEL_TYPE}")
    out += need_equal(spec.get("architectures"), [ARCHITECTURE], "architectures",
                      "the speculators config class registered for dflash declares it",
                      f'write architectures: ["{ARCHITECTURE}"]')
    out += need_equal(get(spec, "speculators_config.algorithm"), MODEL_TYPE, "speculators_config.algorithm",
                      "the speculative decoding algorithm", f"write {MODEL_TYPE}")
    verifier = get(spec, "speculators_config.verifier.name_or_path")
    if missing(verifier) or not isinstance(verifier, str) or not verifier:
        out.append(Violation("speculators_config.verifier.name_or_path", f"{verifier!r}; vLLM requires the "
                             "verifier (target) name", "write the target model id or path (target.model)"))
    block = spec.get("block_size")
    out += need_block_size(block, "block_size") + _proposal(spec, block)
    out += need_mask_id(spec.get("mask_token_id"), "mask_token_id", vocab)
    aux = spec.get("aux_hidden_state_layer_ids")
    out += need_layer_ids(aux, "aux_hidden_state_layer_ids", 1, n_target,
                          f"tap target layers 0-based in [0, {n_target - 1}) (aux = id + 1, below the final layer "
                          "output, which speculators feeds separately and its converter drops)")
    out += need_equal(spec.get("sample_from_anchor", False), False, "sample_from_anchor",
                      "dflashx drafters predict after the anchor (block_size - 1 tokens)", "write false")
    if not isinstance(spec.get("sliding_window_non_causal", False), bool):
        out.append(Violation("sliding_window_non_causal", "not a bool", "write true or false"))
    else:
        out += _causality(spec, causal)
    layers = spec.get("transformer_layer_config")
    if not isinstance(layers, Mapping):
        return out + [Violation("transformer_layer_config", "missing or not a mapping; vLLM builds the drafter "
                                "from it", "write the drafter's Qwen3 layer config there")]
    prefix = "transformer_layer_config."
    out += need_layer_stack(layers, prefix, facts.hidden_size)
    out += need_equal(layers.get("model_type"), "qwen3", prefix + "model_type",
                      "speculators builds the layer config class from it", "write qwen3")
    out += need_equal(layers.get("vocab_size"), vocab, prefix + "vocab_size",
                      "the drafter shares the target's embedding and LM head", f"write {vocab}")
    out += need_equal(spec.get("draft_vocab_size"), vocab, "draft_vocab_size",
                      "no draft-vocabulary mapping (t2d/d2t) is shipped", f"write {vocab}")
    k = len(aux) if isinstance(aux, list) else 0
    return out + need_weights(shapes, layers.get("num_hidden_layers"), facts.hidden_size, k,
                              "aux_hidden_state_layer_ids")
