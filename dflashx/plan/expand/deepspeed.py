"""The train stage's launch, as the plan holds it: the resolved argv, world size, nodes and engine config."""

from __future__ import annotations

from dflashx.plan.launch import TrainLaunch
from dflashx.resolve.model import ResolvedRecipe


def launch(recipe: ResolvedRecipe) -> TrainLaunch:
    """`stages.train.launch_argv` (resolved) over the profile's nodes, with the DeepSpeed config it builds."""
    train = recipe.stages.train
    return TrainLaunch(tuple(train.launch_argv), train.world_size, recipe.hardware.nodes, train.deepspeed_config)
