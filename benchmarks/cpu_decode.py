"""The in-process decoder's fixed cost per layer on a CPU: plain greedy decoding (KV cache, batch 1) of
tiny random Qwen3 targets with 1, 2, 4 and 8 decoder layers, one thread.

Tiny models are launch-bound: their weights are read in microseconds, yet each layer's module calls
cost a fixed time. The least-squares slope of ms/token over layers is that time per layer call; the
intercept (embedding, final norm, LM head, argmax, the loop) is about one more call. The serving
model's in-process engine row (`dflashx/plan/estimates/engine.py`, IN_PROCESS) takes the slope; the
speculative decoder's speed-up it then predicts is checked against a measurement in
tests/test_eval_speedup.py (no speculative timing is used here).

Usage: python -m benchmarks.cpu_decode   (writes benchmarks/results/cpu_decode.json)
"""

from __future__ import annotations

import inspect
import json
import platform
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "benchmarks" / "results" / "cpu_decode.json"
LAYERS = (1, 2, 4, 8)
TOKENS, REPEATS = 64, 7
PROMPT = [7, 3, 19, 42, 11, 5, 60, 8, 33, 2]


def tiny(layers: int):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(num_hidden_layers=layers, vocab_size=96, hidden_size=64, intermediate_size=128,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         tie_word_embeddings=False)
    return Qwen3ForCausalLM(config).eval()


def greedy(target, prompt: list[int], n: int) -> list[int]:
    """Plain cached greedy decoding, one token per target forward."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=target.config)
    # recent transformers name the cache argument `cache`, earlier 5.x releases `past_key_values`
    kw = "cache" if "cache" in inspect.signature(target.forward).parameters else "past_key_values"
    with torch.no_grad():
        out = target(input_ids=torch.tensor([prompt]), use_cache=True, logits_to_keep=1, **{kw: cache})
        ids = [int(out.logits[0, -1].argmax())]
        while len(ids) < n:
            pos = torch.tensor([[len(prompt) + len(ids) - 1]])
            out = target(input_ids=torch.tensor([[ids[-1]]]), position_ids=pos, use_cache=True, **{kw: cache})
            ids.append(int(out.logits[0, -1].argmax()))
    return ids


def fastest(call, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    import torch

    torch.set_num_threads(1)
    per_token = {}
    for layers in LAYERS:
        target = tiny(layers)
        greedy(target, PROMPT, 4)  # warm-up
        per_token[layers] = fastest(lambda: greedy(target, PROMPT, TOKENS)) / TOKENS
    xs, ys = list(per_token), list(per_token.values())
    slope, intercept = statistics.linear_regression(xs, ys)
    result = {"per_token_s": {str(k): v for k, v in per_token.items()}, "per_layer_call_s": slope,
              "intercept_s": intercept, "tokens": TOKENS, "repeats": REPEATS, "threads": 1,
              "machine": platform.processor() or platform.machine(), "torch": torch.__version__}
    for layers, s in per_token.items():
        print(f"{layers} layers: {s * 1e3:.3f} ms/token")
    print(f"per layer call {slope * 1e3:.3f} ms, intercept {intercept * 1e3:.3f} ms")
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
