"""The tiny mixture-of-experts target, `builtin:tiny-qwen3_moe`: the trained tiny Qwen3, upcycled.

Sparse upcycling (Komatsuzaki et al. 2022, "Sparse Upcycling", arXiv:2212.05055, section 3.1):
every MoE layer's experts start as copies of the dense layer's MLP and a new router picks the
top-k of them per token. With the top-k weights renormalised to sum to 1 (`norm_topk_prob`), a
token's output is the sum of equal experts' outputs times weights summing to 1, i.e. the dense
MLP's output: the upcycled model computes what the trained dense model computes (up to float
summation order) through transformers' real `qwen3_moe` code path (a seeded random router, fused
3-D expert weights, top-2 of 4 routing). So it thinks and answers like `builtin:tiny-qwen3` and
the whole pipeline (generation, QC, training, speculative decoding, export) runs on an MoE target
without training one; the build takes seconds.

The folder is content-addressed like the dense builds: `<cache>/tiny/tiny-qwen3_moe[-small]-<key>`,
the key hashing the dense build's key, `MOE` and this file. Attention, norms, embeddings and head
are the dense model's weights under the same names. This module is not one of the dense build's
sources, so the shipped dense build stays valid.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any, Callable

from dflashx.tiny.build import (MASK_TOKEN_ID, BuildSettings, _build_atomically, _is_built, build_key, cache_root,
                                ensure_tiny_target, model_config)

DENSE = "tiny-qwen3"
NAME = "tiny-qwen3_moe"
# 4 experts, top-2, each as wide as the dense MLP; every layer sparse (`decoder_sparse_step` 1).
MOE: dict[str, Any] = {"num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True, "decoder_sparse_step": 1,
                       "mlp_only_layers": [], "router_seed": 0}
_COPIED = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def moe_config(small: bool = False) -> dict[str, Any]:
    """The config.json fields of the upcycled model (the dense variant's, MoE keys added)."""
    dense = model_config(DENSE, small)
    moe = {k: v for k, v in MOE.items() if k != "router_seed"}
    return {**dense, **moe, "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
            "moe_intermediate_size": dense["intermediate_size"]}


def moe_key(small: bool = False) -> str:
    """sha256 of the dense build's key, the MoE settings and this module's source, 12 hex digits."""
    h = hashlib.sha256(build_key(BuildSettings.for_variant(DENSE, small)).encode())
    h.update(json.dumps(MOE, sort_keys=True).encode() + Path(__file__).read_bytes())
    return h.hexdigest()[:12]


def upcycle(dense: Any, config: dict[str, Any]) -> Any:
    """A `Qwen3MoeForCausalLM` whose experts are copies of `dense`'s MLPs (router: seeded random)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    cfg.architectures = config["architectures"]
    moe = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    experts = config["num_experts"]
    generator = torch.Generator().manual_seed(MOE["router_seed"])
    state: dict[str, torch.Tensor] = {}
    for name, tensor in dense.state_dict().items():
        if ".mlp." not in name:
            state[name] = tensor
    for i, layer in enumerate(dense.model.layers):
        mlp, prefix = layer.mlp, f"model.layers.{i}.mlp."
        gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight], dim=0)  # the fused [2I, H] layout
        state[prefix + "experts.gate_up_proj"] = gate_up.unsqueeze(0).repeat(experts, 1, 1)
        state[prefix + "experts.down_proj"] = mlp.down_proj.weight.unsqueeze(0).repeat(experts, 1, 1)
        h = mlp.gate_proj.weight.shape[1]
        state[prefix + "gate.weight"] = torch.randn(experts, h, generator=generator) / h**0.5
    moe.load_state_dict(state, strict=True)
    return moe.eval()


def ensure_tiny_moe(small: bool = False, log: Callable[[str], None] = lambda _: None) -> Path:
    """The upcycled target's folder, made from the dense build (itself made on first use)."""
    key = moe_key(small)
    dest = cache_root() / f"{NAME}{'-small' if small else ''}-{key}"
    if _is_built(dest, key):
        return dest

    def fill(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        source = ensure_tiny_target(DENSE, small=small, log=log)
        dense = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
        moe = upcycle(dense, moe_config(small))
        ids = torch.arange(10, 74).reshape(2, 32)
        with torch.no_grad():
            gap = float((moe(ids).logits - dense(ids).logits).abs().max())
        moe.save_pretrained(tmp)
        for name in _COPIED:
            if (source / name).is_file():
                shutil.copyfile(source / name, tmp / name)
        report = {"key": key, "dense": str(source), "config": moe_config(small), "mask_token_id": MASK_TOKEN_ID,
                  "max_logit_gap_to_dense": gap}
        (tmp / "build_report.json").write_text(json.dumps(report, indent=2))
        log(f"{NAME}: upcycled {source.name} into {MOE['num_experts']} experts (logit gap {gap:.2e})")

    return _build_atomically(dest, key, fill, log)
