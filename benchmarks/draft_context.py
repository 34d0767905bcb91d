"""One drafting cycle of speculative decoding: the context kept as keys/values vs re-projected each cycle.

Each cycle the drafter drafts a block after the context. `cached` is what `SpecDecoder` does: the
features of the few positions accepted last cycle are fused and projected once
(`DFlashDrafter.extend_context`), then the block is drafted. `re-projected` projects the whole context
again every cycle (what dflashx 0.1.0's evaluation did), so its cost grows with the context length.

Usage: python -m benchmarks.draft_context [--hidden 512] [--layers 2] [--contexts 256 1024 4096]
Prints a table and writes benchmarks/results/draft_context.json. CPU by default; CUDA when present.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from benchmarks.step_parts import timed
from dflashx.dflash.config import DFlashConfig
from dflashx.dflash.model import DFlashDrafter

RESULT = Path(__file__).resolve().parent / "results" / "draft_context.json"
ACCEPTED = 4  # positions joining the context per cycle (tau ~ 4)


def drafter(hidden: int, layers: int, k: int, vocab: int, device: torch.device) -> DFlashDrafter:
    heads = max(1, hidden // 64)
    cfg = DFlashConfig(num_layers=layers, block_size=16, hidden_size=hidden, num_attention_heads=heads,
                       num_key_value_heads=max(1, heads // 4), head_dim=64, intermediate_size=3 * hidden,
                       vocab_size=vocab, target_layer_ids=list(range(k)), num_target_layers=k + 1,
                       mask_token_id=vocab - 1, layer_types=["full_attention"] * layers,
                       causal_layers=[False] * layers)
    torch.manual_seed(0)
    return DFlashDrafter(cfg).to(device).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--target-layers", type=int, default=5, help="k: tapped target layers")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--iters", type=int, default=9, help="timed runs (mean, after 2 warm-up runs)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    d = drafter(args.hidden, args.layers, args.target_layers, args.vocab, device)
    embed = torch.nn.Embedding(args.vocab, args.hidden).to(device)
    head = torch.nn.Linear(args.hidden, args.vocab, bias=False).to(device)
    rows = []
    with torch.no_grad():
        for t in args.contexts:
            feats = torch.randn(1, t, args.target_layers * args.hidden, device=device)
            earlier = d.extend_context(None, feats[:, : t - ACCEPTED])
            # timed() returns (first call, mean after warm-up): the mean is the figure
            _, cached = timed(lambda earlier=earlier, feats=feats, t=t:
                              d.draft_block(d.extend_context(earlier, feats[:, t - ACCEPTED:]), 7, embed, head),
                              2, args.iters)
            _, reprojected = timed(lambda feats=feats: d.draft_block(d.extend_context(None, feats), 7, embed, head),
                                   2, args.iters)
            rows.append({"context": t, "cached_ms": cached * 1e3, "reprojected_ms": reprojected * 1e3,
                         "speedup": reprojected / cached})
    print(f"drafter: hidden {args.hidden}, {args.layers} layers, k={args.target_layers}, vocab {args.vocab}, "
          f"block 16, {ACCEPTED} positions join per cycle, {device}")
    print(f"{'context':>8} {'cached ms':>10} {'re-projected ms':>16} {'speed-up':>9}")
    for r in rows:
        print(f"{r['context']:8d} {r['cached_ms']:10.2f} {r['reprojected_ms']:16.2f} {r['speedup']:8.2f}x")
    RESULT.parent.mkdir(exist_ok=True)
    RESULT.write_text(json.dumps({"args": vars(args), "device": str(device), "torch": torch.__version__,
                                  "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
                                  "python": sys.version.split()[0], "results": rows}, indent=1) + "\n")
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
