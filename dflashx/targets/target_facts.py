"""`TargetFacts`: the architecture facts of one target model, and the parameter counts they imply.

Describes a decoder-only target: its layer stack (full, sliding or linear attention), head
geometry, its feed-forward blocks (dense, or mixture-of-experts with routed and shared experts and
the dense layers some MoE models keep), vocabulary, checkpoint weight formats, and the
per-sequence state a server keeps (KV cache for attention layers, a fixed recurrent state for
Gated DeltaNet layers). Parameter counts are computed from these facts, weight by weight as
transformers 5.x instantiates them (`qwen3`, `qwen3_moe`, `qwen3_5(_moe)`, `gpt_oss`, `llama`
modeling files; a test checks them against `sum(p.numel())` of tiny instantiated models). Pure
data: no torch, no I/O.
"""

# No `from __future__ import annotations` here: pydantic would evaluate every field's string
# annotation when the class is created, which `dflashx plan`'s start-up pays (benchmarks/cli_latency.py).

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

LayerType = Literal["full_attention", "sliding_attention", "linear_attention"]

# Bits per parameter of a checkpoint weight format. MXFP4: 4-bit E2M1 elements plus one 8-bit
# E8M0 scale per block of 32 (OCP Microscaling Formats spec v1.0, section 5.3), 4 + 8/32 = 4.25;
# the gpt-oss model card quotes the same 4.25 bits per parameter for its MoE weights.
WEIGHT_FORMAT_BITS: dict[str, float] = {"mxfp4": 4.25}


class TargetFacts(BaseModel):
    """Architecture facts of one target model (text stack only)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="HF id or builtin name these facts describe.")
    model_type: str = Field(description="transformers model_type of the text stack (the family), e.g. qwen3, "
                                        "qwen3_5_text, qwen3_moe, gpt_oss, llama.")
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    intermediate_size: int = Field(ge=0, description="Dense MLP width (0 when every layer is MoE).")
    vocab_size: int = Field(ge=1)
    max_position_embeddings: int = Field(ge=1)
    layer_types: list[LayerType] = Field(default_factory=list, description="Empty = all full attention.")
    attn_output_gate: bool = Field(False, description="q_proj also produces a sigmoid output gate (qwen3_5).")
    attention_bias: bool = Field(False, description="q/k/v/o projections carry biases (gpt_oss).")
    qk_norm: bool = Field(False, description="RMSNorm over each query and key head (qwen3 families).")
    attention_sinks: bool = Field(False, description="A learned sink logit per attention head (gpt_oss).")
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    mtp_layers: int = Field(0, ge=0, description="Multi-token-prediction layers shipped with the checkpoint.")
    num_params: int | None = Field(None, ge=1, description="Published parameter count; default: computed.")
    mask_token_id: int | None = Field(None, description="An unused embedding row DFlash can use as [MASK].")
    thinking: bool = Field(True, description="The chat template has a thinking/reasoning channel (Qwen3 "
                                             "`enable_thinking`, gpt-oss harmony `analysis`).")
    template_token_ids: list[int] = Field(
        default_factory=list, description="Special tokens the chat template emits (a mask token must be none of them).")
    # Mixture of experts; zero when the model is dense.
    num_experts: int = Field(0, ge=0, description="Routed experts per MoE layer (0 = dense model).")
    num_experts_per_tok: int = Field(0, ge=0, description="Routed experts each token activates (top-k).")
    moe_intermediate_size: int = Field(0, ge=0, description="FFN width of one routed expert.")
    num_shared_experts: int = Field(0, ge=0, description="Experts every token passes through.")
    shared_expert_intermediate_size: int = Field(0, ge=0, description="FFN width of one shared expert.")
    shared_expert_gate: bool = Field(False, description="A sigmoid gate (hidden -> 1) scales the shared "
                                                        "expert (qwen2_moe, qwen3_5_moe).")
    moe_bias: bool = Field(False, description="Router and expert projections carry biases (gpt_oss).")
    dense_layer_ids: list[int] = Field(
        default_factory=list, description="Layers of an MoE model that keep a dense MLP (`mlp_only_layers`, "
                                          "`decoder_sparse_step`, `first_k_dense_replace`).")
    expert_weight_format: Literal["mxfp4"] | None = Field(
        None, description="Format of the routed experts' weights in the published checkpoint; None = its dtype.")
    # Gated DeltaNet (linear attention) geometry; zero when the model has no linear layers.
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    recurrent_state_bytes_per_elem: int = Field(4, description="SSM state dtype size (fp32 in SGLang/transformers).")

    @model_validator(mode="after")
    def _consistent(self) -> "TargetFacts":
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_types)} entries but num_layers is {self.num_layers}"
            )
        if self.num_experts and not (0 < self.num_experts_per_tok <= self.num_experts
                                     and self.moe_intermediate_size > 0):
            raise ValueError("an MoE target needs 0 < num_experts_per_tok <= num_experts and moe_intermediate_size > 0")
        if any(not 0 <= i < self.num_layers for i in self.dense_layer_ids):
            raise ValueError(f"dense_layer_ids {self.dense_layer_ids} name layers outside 0..{self.num_layers - 1}")
        if any(not self.is_moe_layer(i) for i in range(self.num_layers)) and self.intermediate_size == 0:
            raise ValueError("intermediate_size is 0 but the target has dense MLP layers")
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

    @property
    def full_attention_only(self) -> bool:
        """Every layer keeps a whole KV cache (no linear-attention state, no sliding window): a cache whose rows
        can each be rolled back to their own length, which the eval's batched decoder needs."""
        return all(t == "full_attention" for t in self.types)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, index: int) -> bool:
        return self.is_moe and index not in self.dense_layer_ids

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

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
        """One full/sliding attention layer: q/k/v/o projections, their biases, q/k norms, sinks."""
        q_out = self.num_attention_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        q_proj = q_out * (2 if self.attn_output_gate else 1)
        weights = self.hidden_size * (q_proj + 2 * kv_out) + q_out * self.hidden_size
        bias = q_proj + 2 * kv_out + self.hidden_size if self.attention_bias else 0
        norms = 2 * self.head_dim if self.qk_norm else 0
        sinks = self.num_attention_heads if self.attention_sinks else 0
        return weights + bias + norms + sinks

    @property
    def linear_attention_params(self) -> int:
        """Gated DeltaNet layer: in projections (qkv, z, a, b), conv, out, dt_bias, A_log, gated norm."""
        v_dim = self.linear_num_value_heads * self.linear_value_head_dim
        in_proj = self.hidden_size * (self._linear_conv_dim + v_dim + 2 * self.linear_num_value_heads)
        conv = self._linear_conv_dim * self.linear_conv_kernel_dim
        per_head = 2 * self.linear_num_value_heads + self.linear_value_head_dim
        return in_proj + conv + v_dim * self.hidden_size + per_head

    @property
    def mlp_params(self) -> int:
        """One dense SwiGLU MLP (gate, up, down)."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def expert_params(self) -> int:
        """One routed expert: gate/up/down (and gpt_oss's biases on them)."""
        bias = 2 * self.moe_intermediate_size + self.hidden_size if self.moe_bias else 0
        return 3 * self.hidden_size * self.moe_intermediate_size + bias

    @property
    def shared_params(self) -> int:
        """The shared experts of one MoE layer and their gate."""
        gate = self.hidden_size if self.shared_expert_gate else 0
        return self.num_shared_experts * 3 * self.hidden_size * self.shared_expert_intermediate_size + gate

    @property
    def router_params(self) -> int:
        return self.num_experts * (self.hidden_size + (1 if self.moe_bias else 0))

    @property
    def dense_ffn_width(self) -> int:
        """The dense FFN width a drafter for this target gets: the target's dense MLP width, else
        (every layer MoE) the width a token runs through: top-k routed + shared experts."""
        return self.intermediate_size or (self.num_experts_per_tok * self.moe_intermediate_size
                                          + self.num_shared_experts * self.shared_expert_intermediate_size)

    def moe_ffn_params(self, active: bool = False) -> int:
        """One MoE layer's feed-forward weights; `active`: only the top-k routed experts a token uses."""
        routed = self.num_experts_per_tok if active else self.num_experts
        return routed * self.expert_params + self.shared_params + self.router_params

    def ffn_params(self, index: int, active: bool = False) -> int:
        """Layer `index`'s feed-forward weights; `active`: only the top-k routed experts a token uses."""
        return self.moe_ffn_params(active) if self.is_moe_layer(index) else self.mlp_params

    def layer_params(self, index: int, active: bool = False) -> int:
        """Layer `index`: its mixer, feed-forward and two RMSNorms (`active`: top-k experts only)."""
        mixer = self.linear_attention_params if self.types[index] == "linear_attention" else self.attention_params
        return mixer + self.ffn_params(index, active) + 2 * self.hidden_size

    def params_through_layer(self, last_layer: int, active: bool = False) -> int:
        """Non-embedding parameters of layers 0..last_layer (inclusive); `active`: top-k experts only."""
        # `layer_params` follows from a layer's mixer type and whether it is MoE: price each kind once
        # (the planner asks ~100 times per plan; layer by layer that was ~10 ms of `dflashx plan`)
        types = self.types
        counts: dict[tuple[str, bool], int] = {}
        first: dict[tuple[str, bool], int] = {}
        for i in range(min(last_layer + 1, self.num_layers)):
            kind = (types[i], self.is_moe_layer(i))
            counts[kind] = counts.get(kind, 0) + 1
            first.setdefault(kind, i)
        return sum(n * self.layer_params(first[kind], active) for kind, n in counts.items())

    @property
    def embedding_params(self) -> int:
        """Input embedding and LM head (one matrix when tied) and the final norm."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2) + self.hidden_size

    @property
    def total_params(self) -> int:
        """Published count when registered (checkpoint incl. MTP/vision), else every text-stack weight."""
        if self.num_params is not None:
            return self.num_params
        return self.params_through_layer(self.num_layers - 1) + self.embedding_params

    @property
    def active_params(self) -> int:
        """Parameters one token uses: all but the routed experts outside its top-k (embedding table
        and LM head included: Qwen's "activated" convention); for a dense model, every computed weight."""
        return self.params_through_layer(self.num_layers - 1, active=True) + self.embedding_params

    def expected_experts_touched(self, tokens: float) -> float:
        """Distinct routed experts per MoE layer that `tokens` routed tokens use: E (1 - (1 - k/E)^n).
        Uniform, independent routing assumed: each token picks each expert with probability k/E
        (top-k of E), so an expert stays idle for all n tokens with probability (1 - k/E)^n (the
        balls-into-bins occupancy expectation; load-balanced routers aim at uniform use, Fedus et
        al. 2022, Switch Transformer, sec. 2.2). Real routing is skewed, so this is an upper bound."""
        if not self.is_moe:
            return 0.0
        e, k = self.num_experts, self.num_experts_per_tok
        return e * (1.0 - (1.0 - k / e) ** max(tokens, 0.0))

    @property
    def routed_expert_params(self) -> int:
        """All routed experts' weights (the part `expert_weight_format` applies to)."""
        return self.num_moe_layers * self.num_experts * self.expert_params

    def checkpoint_bytes(self, elem_bytes: float) -> float:
        """Bytes of the text stack stored with `elem_bytes` per weight, routed experts in their
        published format when one is set (gpt-oss: MXFP4 experts, the rest bf16)."""
        if self.expert_weight_format is None:
            return self.total_params * elem_bytes
        experts = self.routed_expert_params
        return (self.total_params - experts) * elem_bytes + experts * WEIGHT_FORMAT_BITS[self.expert_weight_format] / 8
