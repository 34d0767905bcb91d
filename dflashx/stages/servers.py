"""What a launch plan's server commands mean on this machine, for the stages that start servers (generate, and
eval with an engine): the interpreter (`stages.generate.server_python`, else the one running dflashx) and, for
a built-in target, its located folder in place of its `builtin:` name (`dflashx.backends.servers.LaunchArgs`)."""

from __future__ import annotations

import sys

from dflashx.backends.servers import LaunchArgs
from dflashx.resolve.model import ResolvedRecipe
from dflashx.targets.locate import locate_target


def launch_args(recipe: ResolvedRecipe) -> LaunchArgs:
    gen = recipe.stages.generate
    names = {gen.serving.checkpoint, recipe.target.model}
    located = tuple((name, str(locate_target(recipe.target))) for name in sorted(names) if name.startswith("builtin:"))
    return LaunchArgs(gen.server_python or sys.executable, located)
