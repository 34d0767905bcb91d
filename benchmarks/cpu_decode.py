"""The in-process decoder's fixed cost per layer on a CPU: plain greedy decoding (KV cache, batch 1) of
tiny random Qwen3 targets with 1, 2, 4 and 8 decoder layers, one thread.

Times are CPU time of the one thread decoding (a shared machine's other processes do not enter them).
Tiny models are launch-bound: their weights are read in microseconds, yet each layer's module calls
cost a fixed time. The least-squares slope of ms/token over layers is that time per layer call; the
intercept (embedding, final norm, LM head, argmax, the loop) is about one more call. The serving
model's in-process engine row (`dflashx/plan/estimates/engine.py`, IN_PROCESS) takes the slope. The
same run then measures the in-process speculative decoder's speed-up over plain greedy decoding
(`speculative`: an untrained and an oracle drafter): validation rows of benchmarks/planner_accuracy.py,
which nothing is derived from (tests/test_eval_speedup.py measures the same on the machine it runs on).

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
    """The fastest of `repeats` runs, in CPU time of the one thread the decoder runs on."""
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        call()
        times.append(time.process_time() - t0)
    return min(times)


def tiny_recipe(config: dict, block: int):
    """The resolved CPU recipe of this measurement: the tiny target, a 1-layer drafter of `block`, the
    prompt and output lengths decoded here (what the planner predicts the speed-up for)."""
    from dflashx.config.schema import Recipe
    from dflashx.resolve import resolve
    from dflashx.targets.read_config import facts_from_config

    config = config | {"mask_token_id": config["vocab_size"] - 1}
    recipe = Recipe.model_validate({
        "name": "cpu-decode", "hardware": {"name": "cpu", "cpu_tflops": 0.1},
        "target": {"model": "tiny", "precision": "fp32"},
        "drafter": {"num_layers": 1, "block_size": block, "num_target_layers": 2},
        "dataset": {"sources": [{"name": "s", "path": "x.jsonl"}], "stats": {
            "prompt_tokens_mean": len(PROMPT), "output_tokens_mean": TOKENS, "output_tokens_p90": TOKENS + 0.01}},
        "stages": {"generate": {"backend": "transformers", "max_tokens": TOKENS}}})
    return resolve(recipe, facts_from_config(config, name="tiny"))


def target_config(target) -> dict:
    """The target's config.json content (what `dflashx plan` reads of a local target)."""
    return json.loads(target.config.to_json_string())


def speculative(block: int, oracle: bool) -> dict:
    """The in-process speculative decoder (1-layer drafter of `block`) against plain greedy decoding of the
    4-layer target, timed in turns; `oracle`: the drafter's forward is run, its proposals are the target's
    own continuation (tau near the block); else an untrained drafter (tau near 1). Times are CPU time of the
    one thread both run on, so other processes on a shared machine do not enter them."""
    import torch

    from dflashx.dflash.acceptance import summarize
    from dflashx.dflash.config import DFlashConfig
    from dflashx.dflash.model import DFlashDrafter
    from dflashx.dflash.spec_decode import SpecDecoder

    target = tiny(4)
    reference = greedy(target, PROMPT, TOKENS)
    cfg = target.config
    resolved = tiny_recipe(target_config(target), block)
    torch.manual_seed(1)
    drafter = DFlashDrafter(DFlashConfig.from_target(resolved.drafter, cfg, None)).eval()
    if oracle:
        forward = drafter.draft_block

        def draft_block(ctx, anchor, embed, head):
            forward(ctx, anchor, embed, head)
            start = ctx.length - len(PROMPT)
            want = (reference + [0] * block)[start + 1: start + block]
            return torch.nn.functional.one_hot(torch.tensor(want), cfg.vocab_size).float() * 10

        drafter.draft_block = draft_block
    decoder = SpecDecoder(target, drafter)
    result = decoder.generate(PROMPT, TOKENS)
    assert result.output_ids == reference
    plain = spec = float("inf")
    for _ in range(REPEATS):
        t0 = time.process_time()
        greedy(target, PROMPT, TOKENS)
        plain = min(plain, time.process_time() - t0)
        t0 = time.process_time()
        decoder.generate(PROMPT, TOKENS)
        spec = min(spec, time.process_time() - t0)
    return {"block": block, "drafter": "oracle" if oracle else "untrained", "speedup": plain / spec,
            "acceptance_by_position": summarize([result], block)["acceptance_by_position"], "tau": result.tau}


def main() -> None:
    import torch

    torch.set_num_threads(1)
    per_token = {}
    for layers in LAYERS:
        target = tiny(layers)
        greedy(target, PROMPT, 4)  # warm-up
        per_token[layers] = fastest(lambda target=target: greedy(target, PROMPT, TOKENS)) / TOKENS
    xs, ys = list(per_token), list(per_token.values())
    slope, intercept = statistics.linear_regression(xs, ys)
    result = {"per_token_s": {str(k): v for k, v in per_token.items()}, "per_layer_call_s": slope,
              "intercept_s": intercept, "tokens": TOKENS, "repeats": REPEATS, "threads": 1,
              "speculative": [speculative(4, False), speculative(4, True), speculative(8, True)],
              "target_config": target_config(tiny(4)),
              "machine": platform.processor() or platform.machine(), "torch": torch.__version__}
    for layers, s in per_token.items():
        print(f"{layers} layers: {s * 1e3:.3f} ms/token")
    print(f"per layer call {slope * 1e3:.3f} ms, intercept {intercept * 1e3:.3f} ms")
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
