"""SGLang's server command lines (`servers.py` lays them out): one server per replica behind sglang_router, or
one server with `--dp-size` per node, with the checkpoint, precision, KV-cache, MTP or DFlash drafter, cache and
parser flags of the resolved recipe. Every emitted command parses with SGLang 0.5.23's own argument parser
(tests/test_sglang_commands.py)."""

from __future__ import annotations

from dflashx.plan.estimates.generation import Serving
from dflashx.plan.expand.engine import BASE_PORT, Engine
from dflashx.plan.launch import LOCAL_HOST, RouterSpec, ServerSpec
from dflashx.resolve.model import ResolvedRecipe
from dflashx.targets.parsers import reasoning_parser
from dflashx.targets.registry import TargetFacts


def mtp_flags(recipe: ResolvedRecipe) -> list[str]:
    """SGLang's draft settings for the target's MTP head (stages.generate.serving.speculative)."""
    spec = recipe.stages.generate.serving.speculative
    return ["--speculative-algorithm", spec.algorithm, "--speculative-num-steps", str(spec.num_steps),
            "--speculative-eagle-topk", str(spec.eagle_topk), "--speculative-num-draft-tokens",
            str(spec.num_draft_tokens)]


def dflash_flags(drafter: str, block_size: int, window: int | None) -> list[str]:
    """SGLang's flags for a DFlash drafter folder (the export's serve command and a generation drafter):
    `--speculative-num-draft-tokens` is DFLASH's block, `--speculative-draft-window-size` the draft's context
    window when a drafter layer slides."""
    flags = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", drafter,
             "--speculative-num-draft-tokens", str(block_size)]
    return flags + (["--speculative-draft-window-size", str(window)] if window is not None else [])


def generation_window(recipe: ResolvedRecipe) -> int | None:
    """The generation drafter's window: this recipe's drafter's, when one of its layers slides."""
    d = recipe.drafter
    return d.sliding_window if "sliding_attention" in d.layer_types else None


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
    if serving.drafter:
        argv += dflash_flags(serving.drafter, recipe.drafter.block_size, generation_window(recipe))
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
