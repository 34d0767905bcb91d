"""The drafter's architecture: `DFlashConfig`, built from the plan and the target, and its
config.json form.

Public API (stable; used by training, speculative decoding, eval and export):

- `DFlashConfig.from_target(drafter, target_config)` — from the resolved recipe's drafter
  (`ResolvedDrafter`: layer ids, mask token, shapes, all decided by `dflashx.resolve`) and the
  target's HF config (dict or `PretrainedConfig`; qwen3_5's nested `text_config` is read) for the
  RoPE and norm settings; the shapes the drafter shares with the target are checked against it.
  Layer ids and γ come from `dflashx.resolve.formulas` (one function each, shared with the plan).
- `DFlashConfig.to_hf_dict()` / `DFlashConfig.from_hf_dict(d)` — the exported config.json, in the
  layout the z-lab `dflash` package and SGLang `--speculative-algorithm DFLASH` read
  (`architectures: ["DFlashDraftModel"]`, `block_size`, `num_target_layers`,
  `dflash_config: {mask_token_id, target_layer_ids, target_model_type, target_architectures}`,
  `layer_types`, Qwen3 fields; the target's family is recorded, the drafter is dense for MoE targets too).
  An architecture whose keys go in the config (`ArchitectureSpec.keys_in_config`; DFlash2 in the published layout,
  z-lab/Qwen3.8-27B-DFlash2: `architectures: ["DFlash2DraftModel"]`) also writes `block_size` and its keys
  (`conv_kernel_size`, `conv_group_size`, `selector_rank`, `selector_top_k`) in `dflash_config` (the reference
  reads each from `dflash_config` first, then the top level); each architecture's `architectures` name is its
  spec's `hf_name` (`dflashx.config.architectures`). The architectures' keys are extra fields, validated and
  defaulted by their architectures as the recipe's are (`architectures.drafter_keys`).
- `DFlashConfig.to_qwen3_config()` — a transformers `Qwen3Config` for the building blocks.

Per-layer causality: the reference makes a layer causal when config `is_causal` says so, otherwise
when the layer is a sliding-window layer. We store every layer's flag in
`dflash_config.causal_layers` and also write the top-level `is_causal` when all layers agree, so
the reference derives the same flags; mixes the reference cannot express are rejected.
An architecture whose sliding layers are not causal (`ArchitectureSpec.causal_sliding` false: DFlash2, whose layers
are all bidirectional within a block; the published checkpoints: sliding layers with `is_causal: false`; the
causal part of DFlash2 is its convolution, which never looks ahead): `from_target` makes them so, the validator
refuses a causal layer, and its config.json always carries `is_causal: false` (without it the reference, SGLang
and vLLM make sliding layers causal).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from dflashx.config.architectures import DEFAULT, architecture, by_hf_name, drafter_keys, known
from dflashx.resolve.flops import DrafterDims, drafter_dims
from dflashx.resolve.formulas import spread_layer_ids
from dflashx.resolve.model import ResolvedDrafter
from dflashx.targets.read_config import text_section

LayerType = Literal["full_attention", "sliding_attention"]


def served_causality(name: str, layer_types: list[LayerType]) -> list[bool]:
    """Each layer's causality as trained and served: DFlash makes sliding layers causal and full
    layers bidirectional (what the engines derive without `is_causal`); an architecture whose sliding layers are
    not causal (DFlash2) makes every layer bidirectional (its config.json says `is_causal: false`)."""
    causal_sliding = architecture(name).causal_sliding
    return [causal_sliding and t == "sliding_attention" for t in layer_types]


def _architecture(d: dict[str, Any]) -> str:
    """The architecture of a config.json's `architectures` (DFlash when absent)."""
    return by_hf_name(d.get("architectures") or [architecture(DEFAULT).hf_name]).name


def _config_dict(target_config: Any) -> dict[str, Any]:
    return target_config if isinstance(target_config, dict) else target_config.to_dict()


def text_config(target_config: Any) -> dict[str, Any]:
    """The target's text stack (`dflashx.targets.read_config.text_section`, the one `text_config` rule)."""
    return dict(text_section(_config_dict(target_config)))


def _rope(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """rope_theta and a plain rope scaling dict from legacy or transformers-5 keys."""
    params = dict(cfg.get("rope_parameters") or {})
    theta = float(cfg.get("rope_theta") or params.get("rope_theta") or 1_000_000.0)
    scaling = cfg.get("rope_scaling")
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
    return theta, (dict(scaling) if scaling else None)


class DFlashConfig(BaseModel):
    """Everything that fixes the drafter's shapes and behaviour."""

    model_config = ConfigDict(extra="allow")  # the architectures' keys (module doc); any other key is refused

    num_layers: int = Field(ge=1)
    block_size: int = Field(ge=2)
    hidden_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_key_value_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: dict[str, Any] | None = None
    vocab_size: int = Field(ge=1)
    max_position_embeddings: int = Field(32768, ge=1)
    target_layer_ids: list[int] = Field(min_length=1)
    num_target_layers: int = Field(ge=1, description="N, the target's decoder layer count.")
    mask_token_id: int = Field(ge=0)
    mask_token: str | None = None
    layer_types: list[LayerType]
    causal_layers: list[bool]
    sliding_window: int | None = Field(None, ge=1)
    attention_bias: bool = False
    target_model_type: str | None = Field(None, description="The target's family: transformers model_type of its "
                                          "text stack (qwen3, qwen3_moe, gpt_oss ...); the drafter is dense either "
                                          "way.")
    target_architectures: list[str] = Field(default_factory=list, description="The target config's architectures.")
    architecture: Annotated[str, AfterValidator(known)] = DEFAULT

    @model_validator(mode="before")
    @classmethod
    def _architecture_keys(cls, data: Any) -> Any:
        return drafter_keys(data, cls)

    @model_validator(mode="after")
    def _coherent(self) -> "DFlashConfig":
        n = self.num_layers
        if len(self.layer_types) != n or len(self.causal_layers) != n:
            raise ValueError(f"layer_types and causal_layers need {n} entries (num_layers)")
        if "sliding_attention" in self.layer_types and self.sliding_window is None:
            raise ValueError("sliding_attention layers need drafter.sliding_window")
        ids = self.target_layer_ids
        if any(not 0 <= i < self.num_target_layers for i in ids):
            raise ValueError(f"target_layer_ids {ids} must lie in [0, {self.num_target_layers})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} outside the vocabulary ({self.vocab_size})")
        if not architecture(self.architecture).causal_sliding and any(self.causal_layers):
            raise ValueError(
                f"{self.architecture} layers are bidirectional within a block (served with is_causal: false); "
                f"causal_layers {self.causal_layers} would train what the engines do not run"
            )
        derived = [t == "sliding_attention" for t in self.layer_types]
        if len(set(self.causal_layers)) > 1 and self.causal_layers != derived:
            raise ValueError(
                "mixed per-layer causality must follow the served rule (sliding layers causal, "
                "full layers bidirectional); set all layers alike otherwise"
            )
        return self

    @property
    def k(self) -> int:
        """Number of tapped target layers (the width of `fc` is k * hidden_size)."""
        return len(self.target_layer_ids)

    @property
    def dims(self) -> DrafterDims:
        """The shapes the FLOP model counts (`dflashx.resolve.flops`)."""
        return drafter_dims(self, self.k)

    @classmethod
    def from_target(cls, drafter: ResolvedDrafter, target_config: Any, mask_token: str | None = None) -> "DFlashConfig":
        """Build from the resolved drafter and the target's HF config (RoPE, norms, positions).

        The shapes the resolved drafter took from the plan's target facts must be the checkpoint's.
        """
        t = text_config(target_config)
        heads = int(t["num_attention_heads"])
        actual = {"hidden_size": int(t["hidden_size"]), "num_attention_heads": heads,
                  "num_key_value_heads": int(t.get("num_key_value_heads") or heads),
                  "head_dim": int(t.get("head_dim") or t["hidden_size"] // heads), "vocab_size": int(t["vocab_size"])}
        planned = {k: getattr(drafter, k) for k in actual}
        if planned != actual:
            raise ValueError(f"the plan's target facts {planned} differ from the target's config.json {actual}; "
                             "point target.model at the checkpoint the plan describes (or fix target.arch)")
        theta, scaling = _rope(t)
        return cls(
            num_layers=drafter.num_layers,
            block_size=drafter.block_size,
            **actual,
            intermediate_size=drafter.intermediate_size,
            rms_norm_eps=float(t.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(t.get("max_position_embeddings", 32768)),
            target_layer_ids=list(drafter.target_layer_ids),
            num_target_layers=int(t["num_hidden_layers"]),
            mask_token_id=drafter.mask_token_id,
            mask_token=mask_token,
            layer_types=list(drafter.layer_types),
            causal_layers=served_causality(drafter.architecture, list(drafter.layer_types)),
            sliding_window=drafter.sliding_window,
            attention_bias=bool(t.get("attention_bias", False)),
            target_model_type=t.get("model_type"),
            target_architectures=list(_config_dict(target_config).get("architectures") or []),
            architecture=drafter.architecture,
            **(drafter.model_extra or {}),  # the architectures' keys
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """The exported config.json (z-lab / SGLang DFlash layout, Qwen3 fields)."""
        dflash: dict[str, Any] = {
            "mask_token_id": self.mask_token_id,
            "target_layer_ids": list(self.target_layer_ids),
            "causal_layers": list(self.causal_layers),
            "layer_id_convention": "output of decoder layer l (HF hidden_states[l + 1])",
        }
        if self.mask_token is not None:
            dflash["mask_token"] = self.mask_token
        if self.target_model_type is not None:
            dflash["target_model_type"] = self.target_model_type
        if self.target_architectures:
            dflash["target_architectures"] = list(self.target_architectures)
        spec = architecture(self.architecture)
        if spec.keys_in_config:
            dflash |= {"block_size": self.block_size} | spec.keys_of(self).model_dump()
        out: dict[str, Any] = {
            "architectures": [spec.hf_name],
            "model_type": "qwen3",
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": dflash,
            "num_hidden_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "tie_word_embeddings": False,
            "layer_types": list(self.layer_types),
            "use_sliding_window": self.sliding_window is not None,
            "sliding_window": self.sliding_window,
            "max_window_layers": self.num_layers,
            "torch_dtype": "bfloat16",
        }
        if len(set(self.causal_layers)) == 1:  # always so for DFlash2 (all bidirectional)
            out["is_causal"] = self.causal_layers[0]
        return out

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "DFlashConfig":
        """Read a DFlash or DFlash2 config.json (ours or a public z-lab checkpoint's)."""
        dflash = dict(d.get("dflash_config") or {})
        name = _architecture(d)
        # an architecture's keys as the reference reads them (dflash_config first, then the top level); required,
        # as the reference has no default for them
        spec = architecture(name)
        keys = {key: dflash[key] if key in dflash else d[key] for key in spec.key_names()} \
            if spec.keys_in_config else {}
        n = int(d["num_hidden_layers"])
        types = list(d.get("layer_types") or ["full_attention"] * n)
        if "causal_layers" in dflash:
            causal = [bool(c) for c in dflash["causal_layers"]]
        elif d.get("is_causal") is not None:
            causal = [bool(d["is_causal"])] * n
        else:
            causal = [t == "sliding_attention" for t in types]
        n_target = int(d["num_target_layers"])
        ids = dflash.get("target_layer_ids") or d.get("target_layer_ids") or spread_layer_ids(n_target, n)
        mask_id = dflash.get("mask_token_id", d.get("mask_token_id"))
        if mask_id is None:
            raise ValueError("config.json has no dflash_config.mask_token_id")
        heads = int(d["num_attention_heads"])
        theta, scaling = _rope(d)
        window = d.get("sliding_window") if d.get("use_sliding_window", True) else None
        return cls(
            num_layers=n,
            block_size=int(dflash.get("block_size", d.get("block_size", 16))),
            hidden_size=int(d["hidden_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or d["hidden_size"] // heads),
            intermediate_size=int(d["intermediate_size"]),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            vocab_size=int(d["vocab_size"]),
            max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
            target_layer_ids=[int(i) for i in ids],
            num_target_layers=n_target,
            mask_token_id=int(mask_id),
            mask_token=dflash.get("mask_token"),
            layer_types=types,
            causal_layers=causal,
            sliding_window=window if "sliding_attention" in types else None,
            attention_bias=bool(d.get("attention_bias", False)),
            target_model_type=dflash.get("target_model_type"),
            target_architectures=list(dflash.get("target_architectures") or []),
            architecture=name,
            **keys,
        )

    def to_qwen3_config(self):
        """A transformers `Qwen3Config` describing the same layers (for RoPE, MLP, norms)."""
        from transformers import Qwen3Config

        hf = self.to_hf_dict()
        keep = {k: v for k, v in hf.items() if k not in ("architectures", "model_type", "dflash_config", "torch_dtype")}
        return Qwen3Config(**keep)
