"""SGLang's server command lines (`servers.py` lays them out): one server per replica behind sglang_router, or
one server with `--dp-size` per node, with the checkpoint, precision, KV-cache, MTP or DFlash drafter, cache and
parser flags of the resolved recipe. Every emitted command parses with SGLang 0.5.23's own argument parser
(tests/test_sglang_commands.py)."""

from __future__ import annotations

from dflashx.plan.estimates.generation import Serving
from dflashx.plan.expand.draft import sglang_draft
from dflashx.plan.expand.engine import BASE_PORT, Engine
from dflashx.plan.launch import LOCAL_HOST, RouterSpec, ServerSpec
from dflashx.resolve.model import ResolvedRecipe
from dflashx.targets.parsers import reasoning_parser
from dflashx.targets.registry import TargetFacts


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
    argv += sglang_draft(recipe, bool(recipe.target.mtp and facts.mtp_layers))
    if gen.hierarchical_cache:
        argv += ["--enable-hierarchical-cache"]
    parser = reasoning_parser(facts.model_type, "sglang")
    if recipe.target.chat_template.enable_thinking and parser:
        argv += ["--reasoning-parser", parser]
    return argv


def _router(servers: tuple[ServerSpec, ...]) -> RouterSpec:
    """sglang_router in front of one server per replica (router dp_mode)."""
    return RouterSpec(("python", "-m", "sglang_router.launch_router", "--host", LOCAL_HOST, "--port", str(BASE_PORT),
                       "--worker-urls", *(v.url for v in servers)), BASE_PORT, f"http://{LOCAL_HOST}:{BASE_PORT}")


ENGINE = Engine("sglang", server_argv, router=_router)
