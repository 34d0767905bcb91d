"""The generate stage's launch plan (`dflashx.plan.launch`): SGLang server command lines for the profile
(one server per replica behind sglang_router, or one server with `--dp-size` per node, with the
checkpoint, precision, KV-cache, MTP, cache and parser flags of the resolved recipe), the attached
`stages.generate.urls`, or the transformers backend in-process. Each server carries `in_flight`: the
requests the generate stage keeps open on it, `in_flight_per_replica` x the replicas it serves; attached
URLs share the dp x `in_flight_per_replica` the estimate counts (`split_in_flight`). Every emitted command
parses with SGLang 0.5.23's own argument parser (tests/test_sglang_commands.py)."""

from __future__ import annotations

import math
import shlex

from dflashx.plan.estimates.generation import Serving
from dflashx.plan.estimates.serving import client_in_flight
from dflashx.plan.launch import (
    LOCAL_HOST,
    LaunchPlan,
    RouterSpec,
    ServerSpec,
    base_url,
    node_host,
    split_in_flight,
)
from dflashx.resolve.model import ResolvedRecipe
from dflashx.targets.parsers import reasoning_parser
from dflashx.targets.registry import TargetFacts

BASE_PORT = 30000  # the router (or the single server); workers behind a router take the next ports


def mtp_flags(recipe: ResolvedRecipe) -> list[str]:
    """SGLang's draft settings for the target's MTP head (stages.generate.serving.speculative)."""
    spec = recipe.stages.generate.serving.speculative
    return ["--speculative-algorithm", spec.algorithm, "--speculative-num-steps", str(spec.num_steps),
            "--speculative-eagle-topk", str(spec.eagle_topk), "--speculative-num-draft-tokens",
            str(spec.num_draft_tokens)]


def server_argv(recipe: ResolvedRecipe, facts: TargetFacts, s: Serving, host: str, port: int,
                dp_size: int) -> list[str]:
    gen = recipe.stages.generate
    serving = gen.serving
    argv = [
        "python", "-m", "sglang.launch_server",
        "--model-path", serving.checkpoint,
        "--host", host, "--port", str(port),
        "--tp-size", str(s.tp),
        "--mem-fraction-static", f"{serving.mem_fraction_static:g}",
        "--context-length", str(gen.context_length),
        "--max-running-requests", str(serving.max_running_requests),  # per DP worker
    ]
    if dp_size > 1:
        argv += ["--dp-size", str(dp_size)]
    if serving.online_quantization:
        argv += ["--quantization", "fp8"]
    if serving.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", serving.kv_cache_dtype]
    if recipe.target.mtp and facts.mtp_layers:
        argv += mtp_flags(recipe)
    if gen.hierarchical_cache:
        argv += ["--enable-hierarchical-cache"]
    parser = reasoning_parser(facts.model_type, "sglang")
    if recipe.target.chat_template.enable_thinking and parser:
        argv += ["--reasoning-parser", parser]
    return argv


def _server(recipe: ResolvedRecipe, facts: TargetFacts, s: Serving, per_replica: int, node: int, port: int,
            gpus: range, dp_size: int) -> ServerSpec:
    """One server; servers on other nodes listen on all interfaces and are named `node-<i>`."""
    bind = LOCAL_HOST if node == 0 else "0.0.0.0"
    return ServerSpec(f"http://{node_host(node)}:{port}", per_replica * dp_size,
                      tuple(server_argv(recipe, facts, s, bind, port, dp_size)), port, tuple(gpus), node)


def shell_lines(plan: LaunchPlan) -> list[str]:
    """The plan's commands as shell lines, for people (`[on node-<i>]` before another node's)."""
    lines = [("" if srv.node == 0 else f"[on node-{srv.node}] ")
             + f"CUDA_VISIBLE_DEVICES={','.join(map(str, srv.gpus))} {shlex.join(srv.command)}"
             for srv in plan.servers if srv.command]
    return lines + ([shlex.join(plan.router.command)] if plan.router else [])


def _launched(recipe: ResolvedRecipe, facts: TargetFacts, s: Serving, per_replica: int) -> LaunchPlan:
    """The servers to start on the profile's GPUs; `gpus` are indices on the server's node."""
    hw, servers = recipe.hardware, []
    per_node = max(hw.gpus_per_node // s.tp, 1)  # replicas that fit on one node
    if s.dp > 1 and recipe.stages.generate.serving.dp_mode == "router":
        for replica in range(s.dp):
            node, local = divmod(replica, per_node)
            servers.append(_server(recipe, facts, s, per_replica, node, BASE_PORT + 1 + replica,
                                   range(local * s.tp, (local + 1) * s.tp), 1))
        router = RouterSpec(("python", "-m", "sglang_router.launch_router", "--host", LOCAL_HOST, "--port",
                             str(BASE_PORT), "--worker-urls", *(v.url for v in servers)),
                            BASE_PORT, f"http://{LOCAL_HOST}:{BASE_PORT}")
        return LaunchPlan("launch", per_replica, tuple(servers), router)
    for node in range(math.ceil(s.dp / per_node)):
        dp_here = min(per_node, s.dp - node * per_node)
        servers.append(_server(recipe, facts, s, per_replica, node, BASE_PORT, range(s.tp * dp_here), dp_here))
    return LaunchPlan("launch", per_replica, tuple(servers))


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
    if recipe.hardware.gpu is None:
        return LaunchPlan(mode, per_replica)  # nothing to start on the CPU: the run says to give urls
    return _launched(recipe, facts, s, per_replica)
