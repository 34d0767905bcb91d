"""Each drafter layer's causality: as it was trained, as each engine reads it from a layout, and the rule
that they agree.

A DFlash layer attends bidirectionally inside the block or causally; which one is a per-layer fact of
training (`dflash_config.causal_layers`, `dflashx.dflash.config.DFlashConfig`), and each engine derives
it from the config.json it loads, each in its own way:

- SGLang, z-lab layout: causal exactly where the layer slides; it reads no flag
  (`_get_dflash_layer_attention_params`, `export.sglang`).
- vLLM 0.32, z-lab layout (`model_executor/models/qwen3_dflash.py` `_dflash_layer_causal`): the
  top-level `is_causal` for every layer when present, else `dflash_config.causal` for every layer when
  present, else causal exactly where the layer slides.
- vLLM 0.32, speculators layout: `SpeculatorsConfig` builds the model config from
  `transformer_layer_config` and `update_dflash` (`transformers_utils/configs/speculators/algos.py`)
  sets `dflash_config.causal = not sliding_window_non_causal` (absent: true, i.e. non-causal), which then
  decides EVERY layer, full-attention ones included. A speculators folder can therefore only express a
  drafter whose layers are all alike; `sliding_window_non_causal: false` makes an all-bidirectional
  drafter causal. That is what f5ac536's export wrote, and vLLM served it with 8.8% lower τ at every
  position, silently (docs/export.md, "Causality").

Pure: config dicts in, flags out. Public API: `trained`, `sglang_reads`, `vllm_reads`, `vllm_reads_speculators`,
`speculators_flag`, `need_served`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from dflashx.export.contract import Violation, get

SLIDING = "sliding_attention"


def _layer_types(layers: Mapping[str, Any]) -> list[str] | None:
    """One type per layer, else None (`contract.need_layer_stack` names a missing or miscounted list)."""
    types = layers.get("layer_types")
    if not isinstance(types, list) or not types or len(types) != layers.get("num_hidden_layers", len(types)):
        return None
    return list(types)


def _by_type(types: Sequence[str]) -> list[bool]:
    """The convention every loader falls back to: a layer is causal exactly when it slides."""
    return [t == SLIDING for t in types]


def trained(config: Mapping[str, Any]) -> list[bool] | None:
    """The causality a DFlash-layout config.json says the drafter was trained with: `dflash_config.causal_layers`
    (dflashx writes it), else what the z-lab reference derives (top-level `is_causal` for every layer, else
    causal where the layer slides). None when the layer types are unreadable (another rule names them)."""
    flags = get(config, "dflash_config.causal_layers")
    if isinstance(flags, list) and all(isinstance(f, bool) for f in flags):
        return list(flags)
    types = _layer_types(config)
    if types is None:
        return None
    causal = config.get("is_causal")
    return [causal] * len(types) if isinstance(causal, bool) else _by_type(types)


def sglang_reads(config: Mapping[str, Any]) -> list[bool] | None:
    """SGLang: causal exactly where the layer slides (no flag is read)."""
    types = _layer_types(config)
    return None if types is None else _by_type(types)


def vllm_reads(layers: Mapping[str, Any], dflash: Mapping[str, Any] | None) -> list[bool] | None:
    """vLLM 0.32's per-layer causality for a model config (`layers`: its top level) and its `dflash_config`."""
    types = _layer_types(layers)
    if types is None:
        return None
    for flag in (layers.get("is_causal"), (dflash or {}).get("causal")):
        if isinstance(flag, bool):
            return [flag] * len(types)
    return _by_type(types)


def vllm_reads_speculators(spec: Mapping[str, Any]) -> list[bool] | None:
    """vLLM 0.32's per-layer causality for a speculators config.json (`update_dflash`'s conversion)."""
    layers = spec.get("transformer_layer_config")
    if not isinstance(layers, Mapping):
        return None
    return vllm_reads(layers, {"causal": not spec.get("sliding_window_non_causal", True)})


def speculators_flag(causal: Sequence[bool]) -> bool | None:
    """The `sliding_window_non_causal` under which vLLM reads `causal`; None when the layers differ (a speculators
    folder cannot express that: vLLM serves such a drafter from the z-lab layout)."""
    return None if len(set(causal)) != 1 else not causal[0]


def need_served(served: Sequence[bool] | None, wanted: Sequence[bool] | None, key: str, engine: str,
                fix: str) -> list[Violation]:
    """The engine's reading (`served`) must be the trained causality (`wanted`); None on either side: another rule
    names what is unreadable."""
    if served is None or wanted is None or list(served) == list(wanted):
        return []
    return [Violation(key, f"{engine} serves the drafter's layers causal={list(served)} but it was trained "
                           f"causal={list(wanted)}: the drafts are computed with another attention mask and "
                           "acceptance drops with no error", fix)]
