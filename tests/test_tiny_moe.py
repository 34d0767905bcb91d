"""`builtin:tiny-qwen3_moe`: the shipped tiny Qwen3 upcycled into a qwen3_moe target in seconds. It
is a real mixture of experts (routed top-2 of 4, seeded router), computes what the dense model
computes (equal experts, renormalised top-k weights), resolves like the other builtins, and its
build identity follows the dense build's key."""

from __future__ import annotations

import json
import time

import torch

from dflashx.targets.read_config import facts_from_config
from dflashx.targets.registry import lookup
from dflashx.tiny import builtin_identity, locate_builtin, locate_builtin_tokenizer
from dflashx.tiny.build import ensure_tiny_target
from dflashx.tiny.moe import moe_key


def test_the_upcycled_target_routes_and_matches_the_dense_one(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("DFLASHX_CACHE", str(tmp_path))
    t0 = time.perf_counter()
    folder = locate_builtin("builtin:tiny-qwen3_moe")
    assert time.perf_counter() - t0 < 120  # a copy of the shipped dense build and a weight copy, no training
    assert folder.name == f"tiny-qwen3_moe-{moe_key()}" and builtin_identity("builtin:tiny-qwen3_moe") == folder.name
    assert locate_builtin("builtin:tiny-qwen3_moe") == folder  # cached
    facts = facts_from_config(json.loads((folder / "config.json").read_text()), name="builtin:tiny-qwen3_moe")
    assert facts == lookup("builtin:tiny-qwen3_moe").model_copy(update={"mask_token_id": None})  # what the plan assumes

    moe = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    dense = AutoModelForCausalLM.from_pretrained(ensure_tiny_target("tiny-qwen3"), dtype=torch.float32).eval()
    ids = torch.randint(10, 1000, (2, 40), generator=torch.Generator().manual_seed(3))
    picked = []
    hook = moe.model.layers[0].mlp.gate.register_forward_hook(lambda m, a, out: picked.append(out[2]))
    with torch.no_grad():
        gap = (moe(ids).logits - dense(ids).logits).abs().max()
    hook.remove()
    assert gap < 1e-3  # the dense model's function, through routed experts
    assert picked[0].shape[-1] == 2 and len(picked[0].unique()) == 4  # top-2, and every expert gets tokens
    assert locate_builtin_tokenizer("builtin:tiny-qwen3_moe") == locate_builtin_tokenizer("builtin:tiny-qwen3")
