"""Known target architectures: the facts the planner needs, without downloading anything.

`TargetFacts` describes a decoder-only target: its layer stack (full, sliding or linear
attention), head geometry, FFN and vocabulary sizes, and the per-sequence state a server keeps
(KV cache for attention layers, a fixed recurrent state for Gated DeltaNet layers). Sources of
every registered number are listed in docs/planner.md. Pure data: no torch, no I/O.
"""

# No `from __future__ import annotations` here: pydantic would evaluate every field's string
# annotation when the class is created, which `dflashx plan`'s start-up pays (benchmarks/cli_latency.py).

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

LayerType = Literal["full_attention", "sliding_attention", "linear_attention"]


class TargetFacts(BaseModel):
    """Architecture facts of one target model (text stack only)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="HF id or builtin name these facts describe.")
    model_type: str = Field(description="transformers model_type of the text stack, e.g. qwen3, qwen3_5_text.")
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    max_position_embeddings: int = Field(ge=1)
    layer_types: list[LayerType] = Field(default_factory=list, description="Empty = all full attention.")
    attn_output_gate: bool = Field(False, description="q_proj also produces a sigmoid output gate (qwen3_5).")
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    mtp_layers: int = Field(0, ge=0, description="Multi-token-prediction layers shipped with the checkpoint.")
    num_params: int | None = Field(None, ge=1, description="Published parameter count; default: computed.")
    mask_token_id: int | None = Field(None, description="An unused embedding row DFlash can use as [MASK].")
    thinking: bool = Field(True, description="The chat template has a thinking mode (`enable_thinking`).")
    template_token_ids: list[int] = Field(
        default_factory=list, description="Special tokens the chat template emits (a mask token must be none of them).")
    # Gated DeltaNet (linear attention) geometry; zero when the model has no linear layers.
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    recurrent_state_bytes_per_elem: int = Field(4, description="SSM state dtype size (fp32 in SGLang/transformers).")

    @model_validator(mode="after")
    def _layer_types_match(self) -> "TargetFacts":
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_types)} entries but num_layers is {self.num_layers}"
            )
        return self

    # ------------------------------------------------------------------ layer stack

    @property
    def types(self) -> list[str]:
        return list(self.layer_types) or ["full_attention"] * self.num_layers

    @property
    def num_kv_layers(self) -> int:
        """Layers that keep a KV cache (full or sliding attention)."""
        return sum(t != "linear_attention" for t in self.types)

    @property
    def num_linear_layers(self) -> int:
        return sum(t == "linear_attention" for t in self.types)

    # ------------------------------------------------------------------ per-sequence state

    def kv_bytes_per_token(self, elem_bytes: float) -> float:
        """K and V of every attention layer for one token."""
        return 2 * self.num_kv_layers * self.num_kv_heads * self.head_dim * elem_bytes

    @property
    def recurrent_state_bytes(self) -> int:
        """Fixed per-sequence state of the linear-attention layers: SSM state (fp32) + conv state (bf16)."""
        ssm = self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim
        conv = self._linear_conv_dim * max(self.linear_conv_kernel_dim - 1, 0)
        return self.num_linear_layers * (ssm * self.recurrent_state_bytes_per_elem + conv * 2)

    @property
    def _linear_conv_dim(self) -> int:
        return (2 * self.linear_num_key_heads * self.linear_key_head_dim
                + self.linear_num_value_heads * self.linear_value_head_dim)

    # ------------------------------------------------------------------ parameters

    @property
    def attention_params(self) -> int:
        """q/k/v/o projections of one full-attention layer."""
        q_out = self.num_attention_heads * self.head_dim
        q = self.hidden_size * q_out * (2 if self.attn_output_gate else 1)
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        return q + kv + q_out * self.hidden_size

    @property
    def linear_attention_params(self) -> int:
        """Gated DeltaNet projections of one linear-attention layer (qkv, z, a, b, out, conv)."""
        v_dim = self.linear_num_value_heads * self.linear_value_head_dim
        in_proj = self.hidden_size * (self._linear_conv_dim + v_dim + 2 * self.linear_num_value_heads)
        conv = self._linear_conv_dim * self.linear_conv_kernel_dim
        return in_proj + conv + v_dim * self.hidden_size

    @property
    def mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    def layer_params(self, index: int) -> int:
        mixer = self.linear_attention_params if self.types[index] == "linear_attention" else self.attention_params
        return mixer + self.mlp_params

    def params_through_layer(self, last_layer: int) -> int:
        """Non-embedding parameters of layers 0..last_layer (inclusive)."""
        return sum(self.layer_params(i) for i in range(min(last_layer + 1, self.num_layers)))

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def total_params(self) -> int:
        """Published count when known (checkpoint incl. MTP/vision), else computed from the dims."""
        if self.num_params is not None:
            return self.num_params
        return self.params_through_layer(self.num_layers - 1) + self.embedding_params


def _qwen3_5_types(num_layers: int, interval: int = 4) -> list[LayerType]:
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]


_QWEN3 = {"model_type": "qwen3", "vocab_size": 151_936, "max_position_embeddings": 40_960, "mask_token_id": 151_669}

REGISTRY: dict[str, TargetFacts] = {
    facts.name: facts
    for facts in (
        TargetFacts(
            name="Qwen/Qwen3.6-27B", model_type="qwen3_5_text", num_layers=64, hidden_size=5120,
            num_attention_heads=24, num_kv_heads=4, head_dim=256, intermediate_size=17_408,
            vocab_size=248_320, max_position_embeddings=262_144, layer_types=_qwen3_5_types(64),
            attn_output_gate=True, mtp_layers=1, num_params=27_800_000_000, mask_token_id=248_070,
            linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
            linear_value_head_dim=128, linear_conv_kernel_dim=4,
        ),
        TargetFacts(
            name="Qwen/Qwen3-8B", num_layers=36, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
            head_dim=128, intermediate_size=12_288, num_params=8_190_000_000, **_QWEN3,
        ),
        TargetFacts(
            name="Qwen/Qwen3-32B", num_layers=64, hidden_size=5120, num_attention_heads=64, num_kv_heads=8,
            head_dim=128, intermediate_size=25_600, num_params=32_800_000_000, **_QWEN3,
        ),
    )
}

# Architecture aliases for `target.arch` (a local fine-tune of a known model).
ALIASES: dict[str, str] = {
    "qwen3_5-27b": "Qwen/Qwen3.6-27B",
    "qwen3.5-27b": "Qwen/Qwen3.6-27B",
    "qwen3.6-27b": "Qwen/Qwen3.6-27B",
    "Qwen/Qwen3.5-27B": "Qwen/Qwen3.6-27B",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-32b": "Qwen/Qwen3-32B",
}

BUILTIN_PREFIX = "builtin:"


def _tiny(name: str, linear: bool) -> TargetFacts:
    """The built-in tiny targets: a copy of dflashx/tiny/build.py's VARIANTS (a test keeps them equal)."""
    extra: dict = {}
    if linear:
        extra = {"model_type": "qwen3_5_text", "layer_types": _qwen3_5_types(6, interval=3),
                 "attn_output_gate": True, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                 "linear_key_head_dim": 32, "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4}
    return TargetFacts(**{
        "name": name, "model_type": "qwen3", "num_layers": 6, "hidden_size": 192, "num_attention_heads": 6,
        "num_kv_heads": 2, "head_dim": 32, "intermediate_size": 512, "vocab_size": 1024,
        "max_position_embeddings": 1024, "layer_types": ["full_attention"] * 6, "mask_token_id": 5, **extra,
    })


BUILTIN: dict[str, TargetFacts] = {
    "builtin:tiny-qwen3": _tiny("builtin:tiny-qwen3", linear=False),
    "builtin:tiny-qwen3_5": _tiny("builtin:tiny-qwen3_5", linear=True),
}


def lookup(model_or_arch: str) -> TargetFacts | None:
    """Facts for an HF id, a builtin target or an architecture alias; None when unknown."""
    if model_or_arch.startswith(BUILTIN_PREFIX):
        return BUILTIN.get(model_or_arch)
    key = ALIASES.get(model_or_arch, ALIASES.get(model_or_arch.lower(), model_or_arch))
    return REGISTRY.get(key)
