"""The DFlash2 part of the DFlash-layout contract (`architectures: ["DFlash2DraftModel"]`).

What the engines read beyond DFlash's fields. vLLM PR #52816, `vllm/model_executor/models/qwen3_dflash2.py`
(read at vllm-project/vllm 030da62): `int(config.dflash_config[key])` for `conv_kernel_size`,
`conv_group_size`, `selector_rank`, `selector_top_k` (a missing key fails the load), `DFlashGroupedConv`
raises unless `conv_group_size` divides `hidden_size`, `base_kernel` [2, K, h] and
`kernel_projection` (h -> 2 K h / group) per `layers.N.attention_conv` / `layers.N.mlp_conv`, the
selector's `predecessor_codebook` / `successor_codebook` as bare parameters [V, r] (no `.weight`)
and `hidden_projection` (h -> r), and the top-k of the V unary logits (k <= V). SGLang PR #35371
(`python/sglang/srt/models/dflash.py`) is not in the stored snapshot (its stored dflash.py predates
DFlash2), so its checks are these same facts plus issue #28's: sliding-window layers need the
top-level `"is_causal": false` (the published drafters' sliding layers are bidirectional). The
names match the reference (`dflash.dflash2`, PyPI `dflash` 0.1.0).

`check_dflash2(config, hidden_size, vocab_size, shapes=None) -> list[Violation]`, pure.
"""

from __future__ import annotations

from typing import Any, Mapping

from dflashx.config.drafter import DFLASH2_KEYS
from dflashx.export.contract import Violation, get, is_int, need_int

KEYS = {key: f"drafter.{key}" for key in DFLASH2_KEYS}  # dflash_config key -> the recipe key it comes from


def _keys(config: Mapping[str, Any], hidden_size: int, vocab_size: int) -> list[Violation]:
    out: list[Violation] = []
    for key, recipe_key in KEYS.items():
        high = vocab_size + 1 if key == "selector_top_k" else None
        out += need_int(get(config, f"dflash_config.{key}"), f"dflash_config.{key}", 1,
                        f"write the value the drafter was trained with ({recipe_key})", high=high,
                        what="an integer (vLLM reads it with int(dflash_config[...]) and fails without it)")
    group = get(config, "dflash_config.conv_group_size")
    if is_int(group) and group >= 1 and hidden_size % group:
        out.append(Violation("dflash_config.conv_group_size", f"{group} does not divide hidden_size {hidden_size}; "
                             "vLLM's DFlashGroupedConv refuses it", "train with a divisor of the hidden size "
                             "(drafter.conv_group_size)"))
    return out


def _causal(config: Mapping[str, Any]) -> list[Violation]:
    types = config.get("layer_types")
    if isinstance(types, list) and "sliding_attention" in types and config.get("is_causal") is not False:
        return [Violation("is_causal", f"{config.get('is_causal')!r} while layers slide: DFlash2's sliding-window "
                          "layers are bidirectional and the loaders make them causal unless the top level says "
                          '"is_causal": false', "write is_causal: false (train every layer bidirectional)")]
    return []


def expected_shapes(config: Mapping[str, Any], hidden_size: int, vocab_size: int) -> dict[str, tuple[int, ...]]:
    """The DFlash2 tensors and their shapes for this config (empty when a size is unreadable)."""
    d = config.get("dflash_config") or {}
    sizes = (config.get("num_hidden_layers"), d.get("conv_kernel_size"), d.get("conv_group_size"),
             d.get("selector_rank"))
    readable = [v for v in sizes if is_int(v) and v >= 1]
    if len(readable) < len(sizes):
        return {}
    n, k, group, rank = readable
    if hidden_size % group:
        return {}
    out: dict[str, tuple[int, ...]] = {
        "candidate_selector.predecessor_codebook": (vocab_size, rank),
        "candidate_selector.successor_codebook": (vocab_size, rank),
        "candidate_selector.hidden_projection.weight": (rank, hidden_size)}
    for i in range(n):
        for conv in ("attention_conv", "mlp_conv"):
            out[f"layers.{i}.{conv}.base_kernel"] = (2, k, hidden_size)
            out[f"layers.{i}.{conv}.kernel_projection.weight"] = (2 * k * hidden_size // group, hidden_size)
    return out


def _weights(config: Mapping[str, Any], hidden_size: int, vocab_size: int,
             shapes: Mapping[str, tuple[int, ...]] | None) -> list[Violation]:
    if shapes is None:
        return []
    fix = "export from a complete DFlash2 checkpoint (train.checkpoint), codebooks saved without `.weight`"
    expected = expected_shapes(config, hidden_size, vocab_size)
    absent = [name for name in expected if name not in shapes]
    if absent:
        return [Violation("model.safetensors", f"DFlash2 tensors {absent[:4]} (of {len(absent)}) are missing", fix)]
    wrong = {name: tuple(shapes[name]) for name, shape in expected.items() if tuple(shapes[name]) != shape}
    if wrong:
        name, shape = next(iter(wrong.items()))
        return [Violation("model.safetensors", f"{name} is {list(shape)}, the config makes it "
                          f"{list(expected[name])} ({len(wrong)} tensor(s) differ)", fix)]
    return []


def check_dflash2(config: Mapping[str, Any], hidden_size: int, vocab_size: int,
                  shapes: Mapping[str, tuple[int, ...]] | None = None) -> list[Violation]:
    """Every DFlash2 rule (module doc) this DFlash-layout config and its weights break."""
    return _keys(config, hidden_size, vocab_size) + _causal(config) + _weights(config, hidden_size, vocab_size, shapes)
