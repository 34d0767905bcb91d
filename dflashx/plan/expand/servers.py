"""The generate stage's launch plan (`dflashx.plan.launch`), whatever the engine: the servers to start on the
profile's GPUs (one per replica when `dp_mode` is router, else one per node with data parallelism over its
replicas; vLLM's CPU build: one server on the CPU), the attached `stages.generate.urls`, or the transformers
backend in-process. Each server carries `in_flight`: the requests the generate stage keeps open on it,
`in_flight_per_replica` x the replicas it serves; attached URLs share the dp x `in_flight_per_replica` the
estimate counts (`split_in_flight`). Each engine's command lines are its own module's (`Engine`: `sglang.py`,
`vllm.py`); every emitted command parses with that engine's own argument parser (tests/test_sglang_commands.py,
tests/test_vllm_commands.py)."""

from __future__ import annotations

import math
import shlex

from dflashx.plan.estimates.generation import Serving
from dflashx.plan.estimates.serving import client_in_flight
from dflashx.plan.expand import sglang, vllm
from dflashx.plan.expand.engine import BASE_PORT, Engine
from dflashx.plan.launch import LOCAL_HOST, LaunchPlan, ServerSpec, base_url, node_host, split_in_flight
from dflashx.resolve.model import ResolvedRecipe
from dflashx.targets.registry import TargetFacts

ENGINES: dict[str, Engine] = {"sglang": sglang.ENGINE, "vllm": vllm.ENGINE}


def _server(engine: Engine, recipe: ResolvedRecipe, facts: TargetFacts, s: Serving, per_replica: int, node: int,
            port: int, gpus: range, dp_size: int) -> ServerSpec:
    """One server; servers on other nodes listen on all interfaces and are named `node-<i>`."""
    bind = LOCAL_HOST if node == 0 else "0.0.0.0"
    return ServerSpec(f"http://{node_host(node)}:{port}", per_replica * dp_size,
                      tuple(engine.argv(recipe, facts, s, bind, port, dp_size)), port, tuple(gpus), node,
                      tuple(sorted(engine.env(recipe, facts, s).items())))


def shell_lines(plan: LaunchPlan) -> list[str]:
    """The plan's commands as shell lines, for people (`[on node-<i>]` before another node's)."""
    lines = []
    for srv in plan.servers:
        if not srv.command:
            continue
        env = ([f"CUDA_VISIBLE_DEVICES={','.join(map(str, srv.gpus))}"] if srv.gpus else []) + [
            f"{key}={shlex.quote(value)}" for key, value in srv.env]
        lines.append(("" if srv.node == 0 else f"[on node-{srv.node}] ") + " ".join([*env, shlex.join(srv.command)]))
    return lines + ([shlex.join(plan.router.command)] if plan.router else [])


def _launched(engine: Engine, recipe: ResolvedRecipe, facts: TargetFacts, s: Serving, per_replica: int) -> LaunchPlan:
    """The servers to start on the profile's GPUs (`gpus` are indices on the server's node), or the CPU's one."""
    hw, servers = recipe.hardware, []
    if hw.gpu is None:  # vLLM's CPU build: one server, no GPU
        return LaunchPlan("spawn", per_replica, (_server(engine, recipe, facts, s, per_replica, 0, BASE_PORT,
                                                          range(0), 1),))
    per_node = max(hw.gpus_per_node // s.tp, 1)  # replicas that fit on one node
    if s.dp > 1 and recipe.stages.generate.serving.dp_mode == "router":
        for replica in range(s.dp):
            node, local = divmod(replica, per_node)
            servers.append(_server(engine, recipe, facts, s, per_replica, node, BASE_PORT + 1 + replica,
                                   range(local * s.tp, (local + 1) * s.tp), 1))
        return LaunchPlan("spawn", per_replica, tuple(servers), engine.router(tuple(servers)))
    for node in range(math.ceil(s.dp / per_node)):
        dp_here = min(per_node, s.dp - node * per_node)
        servers.append(_server(engine, recipe, facts, s, per_replica, node, BASE_PORT, range(s.tp * dp_here),
                               dp_here))
    return LaunchPlan("spawn", per_replica, tuple(servers))


def launch_plan(recipe: ResolvedRecipe, facts: TargetFacts, s: Serving) -> LaunchPlan:
    """How generation is served: the resolved `stages.generate.serving.mode` (module doc)."""
    gen = recipe.stages.generate
    mode = gen.serving.mode
    if mode == "in-process":
        return LaunchPlan(mode, max(s.batch, 1))  # the transformers batch (`batch_size`)
    per_replica = client_in_flight(gen, s.batch)
    if mode == "attach":
        shares = split_in_flight(per_replica * s.dp, len(gen.urls))
        servers = tuple(ServerSpec(base_url(url), n) for url, n in zip(gen.urls, shares))
        return LaunchPlan(mode, per_replica, servers)
    engine = ENGINES[gen.backend]
    if recipe.hardware.gpu is None and not engine.runs_on_cpu:
        return LaunchPlan(mode, per_replica)  # nothing to start on the CPU: a plan error says to give urls
    return _launched(engine, recipe, facts, s, per_replica)
