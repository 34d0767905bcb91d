"""What the launch plan needs of a serving engine (`servers.py` lays the servers out, each engine's module
writes its command lines): its server argv, the environment it adds, the router it puts in front of several
servers (None: the generate client spreads the requests itself), and whether it runs without a GPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from dflashx.plan.estimates.generation import Serving
from dflashx.plan.launch import RouterSpec, ServerSpec
from dflashx.resolve.model import ResolvedRecipe
from dflashx.targets.registry import TargetFacts

BASE_PORT = 30000  # the router (or the single server); workers behind a router take the next ports

Argv = Callable[[ResolvedRecipe, TargetFacts, Serving, str, int, int], list[str]]
Env = Callable[[ResolvedRecipe, TargetFacts, Serving], Mapping[str, str]]
Router = Callable[[tuple[ServerSpec, ...]], "RouterSpec | None"]


def no_env(_recipe: ResolvedRecipe, _facts: TargetFacts, _s: Serving) -> Mapping[str, str]:
    return {}


def no_router(_servers: tuple[ServerSpec, ...]) -> RouterSpec | None:
    return None


@dataclass(frozen=True)
class Engine:
    name: str
    argv: Argv  # (recipe, facts, serving, host, port, data-parallel replicas in this server) -> argv
    env: Env = no_env
    router: Router = no_router
    runs_on_cpu: bool = False
