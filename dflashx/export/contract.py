"""What an engine contract check returns, and the rules both engines share.

A check is a pure function of the written config.json (a dict), the target's facts and,
optionally, the weight shapes (name -> shape, read from model.safetensors without loading it). It
returns `Violation(key, message, fix)`s (a `dflashx.config.problem.Problem`, code `export_contract`):
`key` is the dotted config key the engine reads, `message` what it would do with the value, `fix`
what to change (a recipe key where one decides it). An empty
list means the folder meets the contract. The rules themselves, with their sources, are listed in
docs/export.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence, TypeGuard

from dflashx.config.problem import Problem, describe

LAYER_TYPES = ("full_attention", "sliding_attention")
_MISSING = object()


@dataclass(frozen=True)
class Violation:
    key: str
    message: str
    fix: str
    code: str = "export_contract"

    def __str__(self) -> str:
        return describe(self)


def report(engine: str, violations: Sequence[Problem]) -> str:
    """One plain-words paragraph per broken rule, for StageFailed."""
    lines = [f"the {engine} export breaks {len(violations)} rule(s) of that engine's loader:"]
    lines += [f"  - {v}" for v in violations]
    return "\n".join(lines)


def get(config: Mapping[str, Any], dotted: str) -> Any:
    """The value at a dotted key, or `_MISSING`."""
    value: Any = config
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def missing(value: Any) -> bool:
    return value is _MISSING or value is None


def is_int(value: Any) -> TypeGuard[int]:
    """An integer as JSON writes one: not a bool, not a float (even 5.0)."""
    return isinstance(value, int) and not isinstance(value, bool)


def need_int(value: Any, key: str, low: int, fix: str, high: int | None = None,
             what: str = "an integer") -> list[Violation]:
    """`value` is an int in [low, high) (no upper bound when `high` is None)."""
    if missing(value):
        return [Violation(key, f"missing; the engine needs {what}", fix)]
    if not is_int(value):
        return [Violation(key, f"{value!r} is a {type(value).__name__}, the engine needs {what}", fix)]
    if value < low or (high is not None and value >= high):
        bound = f"[{low}, {high})" if high is not None else f">= {low}"
        return [Violation(key, f"{value} is outside {bound}", fix)]
    return []


def need_equal(value: Any, expected: Any, key: str, why: str, fix: str) -> list[Violation]:
    if value == expected:
        return []
    shown = "missing" if value is _MISSING else repr(value)
    return [Violation(key, f"{shown}, expected {expected!r}: {why}", fix)]


def need_layer_ids(ids: Any, key: str, low: int, high: int, fix: str) -> list[Violation]:
    """A non-empty list of ints, each in [low, high)."""
    if missing(ids):
        return [Violation(key, "missing; the engine would fall back to its own default layer spread", fix)]
    if not isinstance(ids, list) or not ids:
        return [Violation(key, f"{ids!r} is not a non-empty list of layer ids", fix)]
    bad = [i for i in ids if not is_int(i) or not low <= i < high]
    if bad:
        return [Violation(key, f"entries {bad} are not integers in [{low}, {high})", fix)]
    return []


def need_mask_id(value: Any, key: str, vocab_size: int) -> list[Violation]:
    fix = ("write the id as a JSON integer inside the target's vocabulary (drafter.mask_token_id, "
           "default: the target tokenizer's `<|mask|>` / an unused embedding row)")
    return need_int(value, key, 0, fix, high=vocab_size, what=f"an integer token id in [0, {vocab_size})")


def need_block_size(value: Any, key: str) -> list[Violation]:
    fix = "write the block size the drafter was trained with (drafter.block_size)"
    return need_int(value, key, 2, fix, what="the trained block size, an integer >= 2 (an anchor and a mask)")


def need_layer_stack(layers: Mapping[str, Any], prefix: str, hidden_size: int) -> list[Violation]:
    """The decoder-layer fields both engines build the drafter from (`prefix` + key)."""
    out: list[Violation] = []
    n = layers.get("num_hidden_layers")
    out += need_int(n, prefix + "num_hidden_layers", 1, "write the drafter's layer count (drafter.num_layers)")
    out += need_equal(layers.get("hidden_size", _MISSING), hidden_size, prefix + "hidden_size",
                      "the drafter reads the target's embeddings and features",
                      "train the drafter against this target (its hidden size decides the drafter's)")
    out += need_equal(layers.get("hidden_act", "silu"), "silu", prefix + "hidden_act",
                      "the engines' DFlash MLP is SwiGLU only", "write hidden_act: silu")
    types = layers.get("layer_types", _MISSING)
    fix_types = "write one of full_attention | sliding_attention per drafter layer (drafter.layer_types)"
    if missing(types):
        out.append(Violation(prefix + "layer_types", "missing; the loaders would derive the layer types from "
                             "max_window_layers, not from training", fix_types))
        return out
    if not isinstance(types, list) or any(t not in LAYER_TYPES for t in types):
        out.append(Violation(prefix + "layer_types", f"{types!r}: only {list(LAYER_TYPES)} are served", fix_types))
        return out
    if is_int(n) and len(types) != n:
        out.append(Violation(prefix + "layer_types", f"{len(types)} entries for {n} layers (num_hidden_layers)",
                             fix_types))
    if "sliding_attention" in types:
        out += need_int(layers.get("sliding_window"), prefix + "sliding_window", 1,
                        "set drafter.sliding_window to the window the drafter was trained with, or make every "
                        "layer full_attention", what="the window of the sliding_attention layers, in tokens")
        if layers.get("use_sliding_window") is False:
            out.append(Violation(prefix + "use_sliding_window", "false while layers slide: transformers' Qwen3 "
                                 "config then drops sliding_window and the layers attend to everything",
                                 "write use_sliding_window: true"))
    return out


def need_weights(shapes: Mapping[str, tuple[int, ...]] | None, num_layers: Any, hidden_size: int,
                 k: int, ids_key: str) -> list[Violation]:
    """The body tensors exist and `fc` fuses exactly the k tapped layers (`ids_key` names them)."""
    if shapes is None or not is_int(num_layers):
        return []
    names = ["fc.weight", "hidden_norm.weight", "norm.weight"] + [
        f"layers.{i}.{part}.weight" for i in range(num_layers) for part in (
            "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
            "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
    absent = [n for n in names if n not in shapes]
    if absent:
        return [Violation("model.safetensors", f"tensors {absent[:4]} (of {len(absent)}) are missing",
                          "export from a complete drafter checkpoint (train.checkpoint)")]
    fc = tuple(shapes["fc.weight"])
    if fc != (hidden_size, k * hidden_size):
        return [Violation(ids_key, f"names {k} layers but fc.weight is {list(fc)}, i.e. "
                          f"{fc[-1] // max(hidden_size, 1)} fused layers of width {hidden_size}",
                          "keep the tapped-layer list the drafter was trained with")]
    return []
