"""Targets, drafters and prompts for the batched decoder's tests.

A tiny saved target (dense qwen3, qwen3_moe or llama; hidden 64, 4 layers) with its LM head tilted towards
one token (`TOKEN`): its logit rises by about `strength` along the mean direction of the target's final
hidden states, so the target emits it often but not always, depending on the context. A drafter that always
drafts it (`helpers_dflash.repeating_drafter`; DFlash2: `helpers_dflash2.partly_right_drafter`, whose
convolutions and selector still act) then has 0 to B-1 drafts accepted per cycle: rows of one batch accept
different numbers of drafts, greedily and sampled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dflashx.targets.load import fastest_experts
from dflashx.tiny.tokenizer import train_tokenizer
from helpers_dflash import TEXTS, load_target, repeating_drafter, tiny_target
from helpers_dflash2 import partly_right_drafter
from helpers_moe import tiny_moe_target

FAMILIES = ("qwen3", "qwen3_moe", "llama")
TOKEN = 39
LENGTHS = (5, 12, 3, 20, 9, 30)  # prompts of different lengths


def _llama(out_dir: Path, seed: int = 0) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = train_tokenizer(TEXTS, vocab_size=320, out_dir=out_dir)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(out_dir)
    return out_dir


def saved_target(out_dir: Path, family: str) -> Path:
    """A tiny random `family` target and its tokenizer in `out_dir`."""
    if family == "qwen3":
        return tiny_target(out_dir)
    if family == "llama":
        return _llama(out_dir)
    return tiny_moe_target(out_dir, family)


def prompts(lengths: tuple[int, ...] = LENGTHS, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(20, 250, (n,), generator=g).tolist() for n in lengths]


@torch.no_grad()
def tilt(model: Any, token: int = TOKEN, strength: float = 3.0) -> Any:
    """Raise `token`'s logit by about `strength` where the final hidden state points the usual way (module doc)."""
    ids = torch.randint(20, 250, (8, 32), generator=torch.Generator().manual_seed(1))
    mean = model.get_decoder()(ids).last_hidden_state.reshape(-1, model.config.hidden_size).mean(0)
    model.get_output_embeddings().weight[token] += strength * mean / mean.pow(2).sum()
    return model


def tilted_target(out_dir: Path, family: str) -> tuple[Any, Any]:
    """(model, tokenizer): `saved_target` loaded in fp32 as the eval stage loads it (MoE experts on grouped_mm),
    then tilted."""
    model, tok = load_target(saved_target(out_dir, family))
    return tilt(fastest_experts(model)), tok


def drafter(target: Any, tok: Any, architecture: str, block_size: int = 6) -> Any:
    """A DFlash or DFlash2 drafter that drafts `TOKEN` (fp32, eval mode)."""
    make = repeating_drafter if architecture == "dflash" else partly_right_drafter
    return make(target, tok, TOKEN, block_size=block_size).eval()
