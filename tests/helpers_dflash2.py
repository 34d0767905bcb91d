"""DFlash2 drafters for the tests, on the tiny targets of `helpers_dflash`: one with every DFlash2
parameter random (nothing an identity), and one that is partly right on purpose (see
`partly_right_drafter`)."""

from __future__ import annotations

from typing import Any

import torch

from helpers_dflash import repeating_drafter

# small selector and groups for a hidden size of 64 and a vocabulary of ~300
DFLASH2 = {"architecture": "dflash2", "conv_group_size": 16, "selector_rank": 16, "selector_top_k": 4}


def _normal_(tensor: torch.Tensor, std: float, generator: torch.Generator, mean: float = 0.0) -> None:
    tensor.copy_(mean + std * torch.randn(tensor.shape, generator=generator))


def perturb_dflash2(drafter: Any, conv: float, successor: float, seed: int = 5) -> Any:
    """Random convolutions (base taps around the identity, a non-zero kernel projection) and a
    non-zero successor codebook, so that both DFlash2 modules change what is drafted."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in drafter.layers:
            for module in (layer.attention_conv, layer.mlp_conv):
                module.base_kernel.add_(conv * torch.randn(module.base_kernel.shape, generator=g))
                _normal_(module.kernel_projection.weight, conv, g)
        _normal_(drafter.candidate_selector.successor_codebook.weight, successor, g)
    return drafter


def random_drafter(target: Any, tok: Any, **spec: Any) -> Any:
    """A DFlash2 drafter (fp32) whose every parameter is random: norms, convolutions, selector."""
    from helpers_dflash import drafter_config

    from dflashx.dflash.model import DFlashDrafter

    torch.manual_seed(3)
    drafter = DFlashDrafter(drafter_config(target, tok, **DFLASH2, **spec))
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name.endswith("norm.weight"):
                _normal_(p, 0.2, g, mean=1.0)
    return perturb_dflash2(drafter, conv=0.5, successor=1.0).eval()


def partly_right_drafter(target: Any, tok: Any, token: int, **spec: Any) -> Any:
    """A DFlash2 drafter that mostly drafts `token` (accepted where the target repeats it) while its
    convolutions and selector still act. As `helpers_dflash.repeating_drafter`, but the final norm's
    weight is the LM-head row of `token` times the signs of the mask embedding, which keeps `token`
    on top when the (small, non-zero) sublayer outputs move the hidden state; the selector's pair
    scores are large enough to overturn the top-1 where its margin is small (a head scaled up
    after the drafter is built sharpens the unary logits)."""
    drafter = repeating_drafter(target, tok, token, **DFLASH2, **spec)
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():
        mask = target.get_input_embeddings().weight[drafter.config.mask_token_id].float()
        drafter.norm.weight.copy_(target.get_output_embeddings().weight[token].float() * mask.sign())
        for layer in drafter.layers:
            _normal_(layer.self_attn.o_proj.weight, 1e-3, g)
            _normal_(layer.mlp.down_proj.weight, 1e-3, g)
        _normal_(drafter.candidate_selector.predecessor_codebook.weight, 1.0, g)
    return perturb_dflash2(drafter, conv=0.3, successor=5.0).eval()
