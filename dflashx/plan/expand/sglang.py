"""SGLang server command lines for the profile: one server per replica behind sglang_router, or one
server with `--dp-size` per node, with the checkpoint, precision, KV-cache, MTP, cache and parser
flags of the resolved recipe. Each server entry carries `in_flight`: the requests the generate
stage keeps open on it, the planned running batch x the replicas it serves. Every emitted command
parses with SGLang 0.5.23's own argument parser (tests/test_sglang_commands.py)."""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from typing import Any

from dflashx.plan.estimates.generation import Serving
from dflashx.resolve.model import ResolvedRecipe
from dflashx.targets.parsers import reasoning_parser
from dflashx.targets.registry import TargetFacts

HOST = "127.0.0.1"
BASE_PORT = 30000  # the router (or the single server); workers behind a router take the next ports


@dataclass
class SglangExpansion:
    servers: list[dict[str, Any]] = field(default_factory=list)  # {command: argv, port, url, gpus}
    router: dict[str, Any] | None = None  # {command, port, url} when replicas sit behind sglang_router
    commands: list[str] = field(default_factory=list)  # shell lines, for people

    def to_json(self) -> dict[str, Any]:
        return {"servers": self.servers, "router": self.router}


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


def _server(recipe: ResolvedRecipe, facts: TargetFacts, s: Serving, node: int, port: int, gpus: list[int],
            dp_size: int) -> dict[str, Any]:
    """One server entry; servers on other nodes listen on all interfaces and are named `node-<i>`."""
    bind, name = (HOST, HOST) if node == 0 else ("0.0.0.0", f"node-{node}")
    return {"command": server_argv(recipe, facts, s, bind, port, dp_size), "port": port,
            "url": f"http://{name}:{port}", "gpus": gpus, "node": node, "in_flight": max(s.batch, 1) * dp_size}


def _shell_line(server: dict[str, Any]) -> str:
    where = "" if server["node"] == 0 else f"[on node-{server['node']}] "
    return f"{where}CUDA_VISIBLE_DEVICES={','.join(map(str, server['gpus']))} {shlex.join(server['command'])}"


def expand_sglang(recipe: ResolvedRecipe, facts: TargetFacts, s: Serving) -> SglangExpansion:
    """Servers to start; none when the recipe attaches to `generate.urls` or uses transformers.

    `gpus` are the GPU indices on the server's node (`CUDA_VISIBLE_DEVICES`).
    """
    gen, hw = recipe.stages.generate, recipe.hardware
    if gen.backend != "sglang" or gen.urls or hw.gpu is None:
        return SglangExpansion()
    out = SglangExpansion()
    per_node = max(hw.gpus_per_node // s.tp, 1)  # replicas that fit on one node
    if s.dp > 1 and gen.serving.dp_mode == "router":
        for replica in range(s.dp):
            node, local = divmod(replica, per_node)
            out.servers.append(_server(recipe, facts, s, node, BASE_PORT + 1 + replica,
                                       list(range(local * s.tp, (local + 1) * s.tp)), 1))
        out.router = {"command": ["python", "-m", "sglang_router.launch_router", "--host", HOST,
                                  "--port", str(BASE_PORT), "--worker-urls", *(v["url"] for v in out.servers)],
                      "port": BASE_PORT, "url": f"http://{HOST}:{BASE_PORT}"}
    else:
        for node in range(math.ceil(s.dp / per_node)):
            dp_here = min(per_node, s.dp - node * per_node)
            out.servers.append(_server(recipe, facts, s, node, BASE_PORT, list(range(s.tp * dp_here)), dp_here))
    out.commands = [_shell_line(srv) for srv in out.servers]
    if out.router:
        out.commands.append(shlex.join(out.router["command"]))
    return out
