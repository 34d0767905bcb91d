"""The frozen online target partitioned over the ranks with DeepSpeed ZeRO-3 (`target_sharding: zero3`).

Why ZeRO-3 and not tensor parallelism: the target only runs forward, under no grad, and DeepSpeed
runs such a module as ZeRO-Inference (https://www.deepspeed.ai/2022/09/09/zero-inference.html):
`deepspeed.initialize` with a stage-3 config and no optimizer partitions every parameter over the
ranks and installs hooks that gather a submodule's weights just before it runs and free them
after. That works for any transformers model, MoE experts included (their fused 3-D expert
tensors are partitioned like any other parameter), and runs on CPU with gloo, so it is tested
here; DeepSpeed AutoTP needs a per-family split of each linear layer and of the routed experts
(the MoE layers of qwen3_moe and gpt_oss are not plain `nn.Linear`s), and transformers' `tp_plan`
needs CUDA/NCCL. The config (`ResolvedTrainStage.target_deepspeed_config`,
`dflashx.resolve.deepspeed.target_shard_config`) is the resolved one, used as it is.

Every rank runs the same target forward on its own micro batch (the drafter stays data-parallel
in its own engine), so each gather serves all ranks at once. `FeatureCapture`'s early stop (an
exception out of the deepest tapped layer's hook) is safe under ZeRO-3: the next forward starts
with a fresh gather (tests/test_target_shard.py runs it three times in a row).

The target's input embedding and LM head are also read outside its forward (the drafter embeds
its block tokens and scores its outputs with them); `frozen_io` hands out whole, replicated copies
of those two, gathered once.

Known cost: each rank loads the whole checkpoint into host memory before `deepspeed.initialize`
partitions it (transformers' partitioned loading, `HfDeepSpeedConfig`, requires `accelerate`,
which dflashx does not depend on); host memory must hold one copy per local rank while loading.

Public API: `shard_target(model, config) -> nn.Module`, `is_sharded(model)`, `frozen_io(model) ->
(embed, lm_head_weight)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def shard_target(model: nn.Module, config: dict[str, Any]) -> nn.Module:
    """Partition the frozen `model` over the process group with the ZeRO-3 `config`; returns the
    module to run (the engine's, partitioned in place, in eval mode, hooks installed)."""
    import deepspeed

    model = model.eval().requires_grad_(False)
    engine, _, _, _ = deepspeed.initialize(model=model, config=config)
    return engine.module.eval()


def is_sharded(model: nn.Module) -> bool:
    """Whether `model`'s parameters are ZeRO-3 partitions (DeepSpeed tags each with `ds_id`)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def _whole(weight: torch.Tensor) -> torch.Tensor:
    """A full, replicated copy of a (possibly ZeRO-3 partitioned) frozen weight."""
    if not hasattr(weight, "ds_id"):
        return weight
    import deepspeed

    with deepspeed.zero.GatheredParameters([weight]):
        return weight.detach().clone()


def frozen_io(model: nn.Module) -> tuple[nn.Module, torch.Tensor]:
    """The target's input embedding (a module) and LM-head weight [V, H], whole on every rank:
    the modules themselves when the target is not sharded, gathered copies when it is."""
    lm = cast("PreTrainedModel", model)  # a transformers causal LM (sharded: the ZeRO-3 engine's module, the same)
    embed, head = lm.get_input_embeddings(), lm.get_output_embeddings().weight
    if not is_sharded(model):
        return embed, head
    return nn.Embedding.from_pretrained(_whole(embed.get_parameter("weight")), freeze=True), _whole(head)
