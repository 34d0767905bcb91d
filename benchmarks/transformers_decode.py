"""The transformers backend's fixed cost per layer call on a CPU: batched `model.generate` (the generate
stage's `backend: transformers`, greedy, KV cache) of random Qwen3 targets with the built-in tiny
target's shapes (hidden 192, 6 heads of 32, 2 KV heads, FFN 512, vocab 1024) and 1, 2, 4 and 8 decoder
layers, a batch of 32 prompts of 40 tokens, one thread.

A decode step costs the same fixed time per layer call whatever the batch holds, on top of its small
matrix products: the time of one step is taken between two lengths (72 and 8 new tokens, every
sequence forced to run to them: the prefill and the set-up cancel), and the least-squares slope of the
step time over layers is the time per layer call. The serving model's transformers row
(`dflashx/plan/estimates/engine.py`, TRANSFORMERS) takes the slope. Times are CPU time of the one thread
(a shared machine's other processes do not enter them); the fastest of REPEATS.

Usage: python -m benchmarks.transformers_decode   (writes benchmarks/results/transformers_decode.json)
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

from dflashx.store.atomic import atomic_write_text

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "benchmarks" / "results" / "transformers_decode.json"
LAYERS = (1, 2, 4, 8)
BATCH, PROMPT, SHORT, LONG, REPEATS = 32, 40, 8, 72, 3


def target(layers: int):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(num_hidden_layers=layers, vocab_size=1024, hidden_size=192, intermediate_size=512,
                         num_attention_heads=6, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
                         tie_word_embeddings=False, eos_token_id=None, pad_token_id=0)
    return Qwen3ForCausalLM(config).eval()


def generate_seconds(model, new_tokens: int) -> float:
    """CPU time of one batched greedy generate of exactly `new_tokens` tokens per sequence (fastest of REPEATS)."""
    import torch

    ids = torch.randint(1, 1024, (BATCH, PROMPT), generator=torch.Generator().manual_seed(0))
    best = float("inf")
    for _ in range(REPEATS):
        start = time.process_time()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False)
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    import torch

    torch.set_num_threads(1)
    step = {}
    for layers in LAYERS:
        model = target(layers)
        step[layers] = (generate_seconds(model, LONG) - generate_seconds(model, SHORT)) / (LONG - SHORT)
        print(f"{layers} layers: {step[layers] * 1e3:.2f} ms per step of {BATCH} sequences", flush=True)
    slope, intercept = statistics.linear_regression(list(step), list(step.values()))
    print(f"per layer call: {slope * 1e3:.3f} ms, intercept {intercept * 1e3:.3f} ms")
    result = {"step_s": {str(k): v for k, v in step.items()}, "per_layer_call_s": slope, "intercept_s": intercept,
              "batch": BATCH, "prompt_tokens": PROMPT, "new_tokens": [SHORT, LONG], "repeats": REPEATS, "threads": 1,
              "torch": torch.__version__, "machine": platform.machine(), "cpu_count": os.cpu_count(),
              "load_avg_1m": os.getloadavg()[0], "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_text(RESULT, json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
