"""The plan's drafter parameters equal sum(numel) of the built model, for DFlash and DFlash2: the one
count (`DrafterDims.trainable`) that model states, checkpoints, gradient sync and the export read."""

from __future__ import annotations

import pytest
from helpers_dflash import config_for

from dflashx.config.architectures import dflash2
from dflashx.config.architectures.dflash2 import DFlash2Keys
from dflashx.config.architectures.spec import Shapes
from dflashx.dflash.model import DFlashDrafter
from dflashx.resolve.flops import DrafterDims

TARGET = {"model_type": "qwen3", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
          "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "max_position_embeddings": 512}
WIDE = TARGET | {"vocab_size": 320, "hidden_size": 96, "intermediate_size": 160, "num_attention_heads": 6,
                 "num_key_value_heads": 3}

SHAPES = [
    (TARGET, {}),
    (TARGET, {"num_layers": 2, "num_target_layers": 3}),
    (WIDE, {"num_layers": 3, "intermediate_size": 48}),
    (TARGET, {"architecture": "dflash2"}),
    (TARGET, {"architecture": "dflash2", "num_layers": 2, "conv_kernel_size": 3, "conv_group_size": 8,
              "selector_rank": 24, "selector_top_k": 4}),
    (WIDE, {"architecture": "dflash2", "num_layers": 3, "conv_group_size": 32, "selector_rank": 40}),
]


@pytest.mark.parametrize("target,drafter", SHAPES)
def test_plan_counts_every_parameter_of_the_built_drafter(target, drafter):
    config = config_for(target, **drafter)
    model = DFlashDrafter(config)
    dims = config.dims
    assert dims.trainable == sum(p.numel() for p in model.parameters())
    # the AdamW share under Muon: what is not a weight matrix a whole slot's gradient reaches
    vectors = sum(p.numel() for n, p in model.named_parameters() if p.ndim != 2 or "codebook" in n)
    assert dims.adamw_params == vectors
    # the architecture's own modules (DFlash2's convolutions and selector; none for DFlash): its entry's count
    own = sum(p.numel() for n, p in model.named_parameters() if model.own_modules & set(n.split(".")))
    assert dims.modules.params == own


def test_dflash2_codebooks_for_qwen36():
    """V = 248,320, r = 256: two codebooks of 63.6M each, 127M in all (issue #28)."""
    keys = DFlash2Keys(conv_kernel_size=2, conv_group_size=16, selector_rank=256, selector_top_k=16)
    dims = DrafterDims(5, 5120, 24, 4, 256, 17408, 248_320, 5, dflash2.figures(Shapes(5, 5120, 248_320), keys))
    assert dims.codebook_params == 2 * 248_320 * 256 == 127_139_840
    plain = DrafterDims(5, 5120, 24, 4, 256, 17408, 248_320, 5)
    assert dims.trainable - plain.trainable == dims.conv_params + dims.selector_params
