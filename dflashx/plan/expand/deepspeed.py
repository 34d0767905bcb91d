"""The train stage's launch, as the plan shows it: the resolved argv, its shell form and hostfile."""

from __future__ import annotations

import shlex
from typing import Any

from dflashx.resolve.model import ResolvedRecipe


def launch(recipe: ResolvedRecipe) -> dict[str, Any]:
    """`stages.train.launch` (resolved), with a hostfile line per node for several nodes."""
    hw, train = recipe.hardware, recipe.stages.train
    hostfile = [f"node-{i} slots={hw.gpus_per_node}" for i in range(hw.nodes)] if hw.nodes > 1 else None
    return {"command": list(train.launch), "shell": shlex.join(train.launch), "hostfile": hostfile,
            "world_size": train.world_size}
