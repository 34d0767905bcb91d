"""What one token-mixing layer costs in a prefill on this GPU: Gated DeltaNet and full attention.

Usage (on a GPU machine, flash-linear-attention installed): python -m benchmarks.prefill_mixers [--seq 8192]
Prints a table and writes benchmarks/results/prefill_mixers.json.

For each registered hybrid target (Qwen3.6-27B, Qwen3.6-35B-A3B) it builds the target's decoder layers
(published attention and linear-attention shapes, random bf16 weights) with a one-row feed-forward, so a
layer is its token mixer plus norms, and times a no-grad forward of one `--seq`-token prompt through 2 and 6
layers of one kind (all `linear_attention`, or all `full_attention`). The slope between the two depths is one
layer's time, free of the embedding and the final norm. The planner's prefill model prices the weight GEMMs
from FLOPs; a Gated DeltaNet's chunked scan and attention over the prompt are kernels whose time does not
follow the weights' FLOPs, and these rows measure them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks.device_ceilings import cuda_median_s

RESULT = Path(__file__).resolve().parent / "results" / "prefill_mixers.json"
TARGETS = ("Qwen/Qwen3.6-27B", "Qwen/Qwen3.6-35B-A3B")


def stack(facts: Any, kind: str, layers: int) -> torch.nn.Module:
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(
        hidden_size=facts.hidden_size, num_attention_heads=facts.num_attention_heads,
        num_key_value_heads=facts.num_kv_heads, head_dim=facts.head_dim, intermediate_size=1,
        linear_num_key_heads=facts.linear_num_key_heads, linear_num_value_heads=facts.linear_num_value_heads,
        linear_key_head_dim=facts.linear_key_head_dim, linear_value_head_dim=facts.linear_value_head_dim,
        linear_conv_kernel_dim=facts.linear_conv_kernel_dim, vocab_size=1024, num_hidden_layers=layers,
        layer_types=[kind] * layers, max_position_embeddings=65536, tie_word_embeddings=False)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = Qwen3_5ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval().requires_grad_(False)


def scan_kernel(model: torch.nn.Module) -> str:
    """Where the Gated DeltaNet's chunked scan comes from (fla's kernel, or transformers' torch fallback)."""
    for module in model.modules():
        fn = getattr(module, "chunk_gated_delta_rule", None)
        if fn is not None:
            return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__name__', '?')}"
    import importlib.util

    return "fla installed" if importlib.util.find_spec("fla") else "torch fallback (fla not installed)"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--out", type=Path, default=RESULT)
    args = p.parse_args(argv)
    import transformers

    from dflashx.targets.registry import REGISTRY

    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "transformers": transformers.__version__, "python": sys.version.split()[0],
                              "seq": args.seq, "rows": []}
    print(f"{'target':22} {'layer':18} {'ms/layer':>9}  scan kernel", flush=True)
    for name in TARGETS:
        facts = REGISTRY[name]
        for kind in ("linear_attention", "full_attention"):
            times, kernel = {}, "-"
            for layers in (2, 6):
                model = stack(facts, kind, layers)
                x = torch.randn(1, args.seq, facts.hidden_size, device="cuda", dtype=torch.bfloat16)

                def forward(model: torch.nn.Module = model, x: torch.Tensor = x) -> Any:
                    return model.model(inputs_embeds=x, use_cache=False)

                with torch.no_grad():
                    times[layers] = cuda_median_s(forward, runs=10)
                kernel = scan_kernel(model) if kind == "linear_attention" else "sdpa"
                del model
                torch.cuda.empty_cache()
            per_layer = (times[6] - times[2]) / 4
            result["rows"].append({"target": name, "layer": kind, "seconds_per_layer": per_layer,
                                   "stack_seconds": {str(k): v for k, v in times.items()}, "kernel": kernel})
            print(f"{name:22} {kind:18} {per_layer * 1e3:9.3f}  {kernel}", flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
