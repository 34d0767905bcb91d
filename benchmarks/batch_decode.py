"""The eval stage's decodes one prompt at a time (`SpecDecoder`, batch 1) against one batch per (suite, drafter,
run) (`BatchDecoder`), side by side in one process: wall time, tokens/s, τ, and whether every greedy output and
cycle count is the per-prompt decoder's.

Workloads:
  --run DIR          a tiny run that has trained (`dflashx run recipes/tiny.yaml --until train`): its target, the
                     drafter the train stage hands on and the `untrained` baseline, its eval suites' prompts
                     rendered as the eval stage renders them, its max_new_tokens, stop ids, serving settings and
                     seeds: the eval stage's decodes (tiny recipe: 2 suites x 16 prompts x (trained + untrained
                     greedy + 5 seeds at 0.6 / 0.95 / 20) = 224). Rows `dflash` use the run's drafters; rows
                     `dflash2` (for a DFlash run) put their weights in a DFlash2 drafter whose DFlash2 modules
                     start as the identity (it drafts what the DFlash backbone drafts: tests/test_dflash2_decode.py),
                     so the selector's walk runs at the trained τ.
  --shape NAME       (GPU) a random bf16 target of a published shape (benchmarks/train_step.py SHAPES) with
                     --layers layers and untrained drafters (τ about 1: a cycle per token), --prompts random prompts
                     of --prompt tokens, --tokens new tokens, greedy and --seeds seeds at 0.6 / 0.95 / 20, one suite
                     (`--tiny`: the shape at toy sizes, a CPU check of the script).
Modes: `batch1` (SpecDecoder per prompt), `batched` (BatchDecoder, finished rows dropped), `batched-keep`
(finished rows kept in the batch, drafting nothing). Each mode decodes the whole workload once after a short
warm-up; the device (cuda when present) is synchronized around it.

Usage: python -m benchmarks.batch_decode --run runs/tiny            (CPU or GPU)
       python -m benchmarks.batch_decode --shape qwen3-32b-dense --layers 16   (GPU)
Prints a row as each finishes; writes benchmarks/results/batch_decode.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dflashx.dflash.acceptance import summarize
from dflashx.dflash.batch_decode import BatchDecoder
from dflashx.dflash.model import DFlashDrafter
from dflashx.dflash.spec_decode import SpecDecoder

RESULT = Path(__file__).resolve().parent / "results" / "batch_decode.json"
MODES = ("batch1", "batched", "batched-keep")
SERVING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}


@dataclass
class Workload:
    """What the eval stage decodes: a target, drafters by name (the first also sampled), suites of encoded prompts."""

    target: Any
    drafters: dict[str, DFlashDrafter]
    suites: dict[str, list[list[int]]]
    max_new_tokens: int
    stops: list[int]
    sampling: dict[str, Any]
    seeds: int
    facts: dict[str, Any] = field(default_factory=dict)

    def runs(self, name: str) -> list[dict[str, Any]]:
        greedy = [{"temperature": 0.0, "seed": 0}]
        first = name == next(iter(self.drafters))
        return greedy + ([self.sampling | {"seed": s} for s in range(self.seeds)] if first else [])


def _as_dflash2(drafter: DFlashDrafter) -> DFlashDrafter:
    """The drafter's weights in a DFlash2 drafter whose convolutions and selector start as the identity."""
    cfg = drafter.config.model_validate(drafter.config.model_dump() | {"architecture": "dflash2"})
    torch.manual_seed(0)
    out = DFlashDrafter(cfg)
    missing, unexpected = out.load_state_dict(drafter.state_dict(), strict=False)
    assert not unexpected and all("conv" in k or "selector" in k for k in missing), (missing, unexpected)
    return out.to(next(drafter.parameters()).device).eval()


def run_workload(run_dir: Path, architecture: str, device: str) -> Workload:
    """The eval stage's decodes of a tiny run (module doc)."""
    from dflashx.stages.eval_drafters import UNTRAINED_SEED
    from dflashx.data.chat_mask import render_prompt
    from dflashx.data.suites import suite_prompts
    from dflashx.dflash.checkpoint import load_drafter
    from dflashx.dflash.tau_record import HeldOutTau
    from dflashx.run.rundir import load_plan
    from dflashx.targets.load import load_model, load_tokenizer, stop_ids

    recipe = load_plan(run_dir / "plan.json").resolved
    assert recipe is not None, f"{run_dir}/plan.json holds no resolved recipe"
    target = load_model(recipe.target, recipe.target.load_precision).to(device).eval().requires_grad_(False)
    tokenizer, chat, cfg = load_tokenizer(recipe.target), recipe.target.chat_template, recipe.stages.eval
    heldout = Path(cfg.prompts) if cfg.prompts else run_dir / "ingest" / "eval_prompts.jsonl"
    suites = {s.name: [tokenizer(render_prompt(tokenizer, p, chat), add_special_tokens=False)["input_ids"]
                       for p in suite_prompts(s, heldout)] for s in cfg.suites}
    trained = load_drafter(HeldOutTau.handed_on(run_dir / "train" / "checkpoint"), device).eval()
    torch.manual_seed(UNTRAINED_SEED)
    untrained = DFlashDrafter(trained.config).to(device).eval()
    drafters = {"trained": trained, "untrained": untrained}
    if architecture == "dflash2" and trained.config.architecture == "dflash":
        drafters = {name: _as_dflash2(d) for name, d in drafters.items()}
    deploy = recipe.deploy
    sampling = {"temperature": deploy.temperature, "top_p": deploy.top_p, "top_k": deploy.top_k}
    return Workload(target, drafters, suites, cfg.max_new_tokens, stop_ids(recipe.target, tokenizer), sampling,
                    cfg.sampled_runs, {"run": str(run_dir), "drafter": trained.config.architecture})


def shape_drafter(target: Any, architecture: str, block: int, mask_token_id: int) -> DFlashDrafter:
    """An untrained 1-layer drafter at the target's width tapping 5 spread layers (the target's dtype and device)."""
    from dflashx.dflash.config import DFlashConfig
    from dflashx.resolve.formulas import spread_layer_ids

    t = target.config
    cfg = DFlashConfig(num_layers=1, block_size=block, hidden_size=t.hidden_size,
                       num_attention_heads=t.num_attention_heads, num_key_value_heads=t.num_key_value_heads,
                       head_dim=t.head_dim, intermediate_size=t.intermediate_size, vocab_size=t.vocab_size,
                       target_layer_ids=spread_layer_ids(t.num_hidden_layers, 5), num_target_layers=t.num_hidden_layers,
                       mask_token_id=mask_token_id, layer_types=["full_attention"], causal_layers=[False],
                       architecture=architecture)
    torch.manual_seed(0)
    weight = next(target.parameters())
    with torch.device(weight.device):
        return DFlashDrafter(cfg).to(weight.dtype).eval()


def shape_workload(args: argparse.Namespace, architecture: str, device: str) -> Workload:
    """A random target of a published shape and an untrained drafter (module doc)."""
    from benchmarks.shapes import build_target, shape_of
    from dflashx.targets.load import fastest_experts

    shape = shape_of(args.shape, args.tiny)
    torch.manual_seed(0)
    target = fastest_experts(build_target(shape, args.layers, device, getattr(torch, args.dtype)))  # as eval loads
    drafter = shape_drafter(target, architecture, args.block, shape["mask_token_id"])
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, shape["vocab_size"] - 2, (args.prompt,), generator=g).tolist()
               for _ in range(args.prompts)]
    return Workload(target, {"untrained": drafter}, {"random": prompts}, args.tokens, [], SERVING, args.seeds,
                    {"shape": args.shape, "tiny": args.tiny, "layers": args.layers, "block": args.block,
                     "dtype": args.dtype, "prompt": args.prompt})


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def decode_all(work: Workload, mode: str) -> dict[str, Any]:
    """Every decode of the workload in `mode`: {(suite, drafter, run index): [DecodeResult]} and the wall time."""
    out: dict[tuple[str, str, int], list[Any]] = {}
    _sync()
    start = time.perf_counter()
    for name, drafter in work.drafters.items():
        decoder = SpecDecoder(work.target, drafter) if mode == "batch1" else \
            BatchDecoder(work.target, drafter, compact=mode == "batched")
        for suite, prompts in work.suites.items():
            for i, run in enumerate(work.runs(name)):
                setting = {k: v for k, v in run.items() if k != "seed"}
                gen = torch.Generator(device=decoder.device).manual_seed(run["seed"])
                kw = {"stop_token_ids": work.stops, "generator": gen, **setting}
                out[suite, name, i] = ([decoder.generate(p, work.max_new_tokens, **kw) for p in prompts]
                                       if isinstance(decoder, SpecDecoder) else
                                       decoder.generate(prompts, work.max_new_tokens, **kw))
    _sync()
    return {"results": out, "seconds": time.perf_counter() - start}


def _row(work: Workload, architecture: str, mode: str, decoded: dict[str, Any], base: dict | None) -> dict[str, Any]:
    """One mode's figures: time, throughput, greedy τ per drafter and sampled τ per seed (each pooled over the
    suites), and whether every greedy decode is the per-prompt decoder's (ids and accepted counts)."""
    results, block = decoded["results"], next(iter(work.drafters.values())).config.block_size
    every = [r for rs in results.values() for r in rs]
    tokens = sum(len(r.output_ids) for r in every)

    def tau(name: str, run: int) -> float:
        return summarize([r for (_, n, i), rs in results.items() if n == name and i == run for r in rs], block)["tau"]

    first = next(iter(work.drafters))
    row = {"architecture": architecture, "mode": mode, "seconds": decoded["seconds"], "decodes": len(every),
           "generated_tokens": tokens, "tokens_per_s": tokens / decoded["seconds"],
           "tau_greedy": {name: tau(name, 0) for name in work.drafters},
           "tau_sampled_per_seed": [tau(first, i) for i in range(1, len(work.runs(first)))]}
    if base is not None:
        row["greedy_same_as_batch1"] = all(
            [(r.output_ids, r.accepted) for r in rs] == [(r.output_ids, r.accepted) for r in base[key]]
            for key, rs in results.items() if key[2] == 0)
    return row


def _print(row: dict[str, Any], first: dict[str, Any] | None) -> None:
    speedup = f"{first['seconds'] / row['seconds']:7.2f}x" if first else f"{'':8}"
    same = {True: "yes", False: "NO"}.get(row.get("greedy_same_as_batch1"), "-")
    sampled = row["tau_sampled_per_seed"]
    mean = sum(sampled) / len(sampled) if sampled else float("nan")
    greedy = "/".join(f"{t:.2f}" for t in row["tau_greedy"].values())
    print(f"{row['architecture']:8} {row['mode']:13} {row['seconds']:9.2f} {speedup} {row['decodes']:7} "
          f"{row['tokens_per_s']:9.1f} {greedy:>11} {mean:7.3f} {same:>5}", flush=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", type=Path, help="a tiny run folder that has trained")
    src.add_argument("--shape", help="a published shape (benchmarks/train_step.py SHAPES)")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--tiny", action="store_true", help="--shape at toy sizes (a CPU check of the script)")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="--shape's weights")
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--architectures", nargs="+", default=["dflash", "dflash2"], choices=["dflash", "dflash2"])
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--out", type=Path, default=RESULT)
    args = p.parse_args(argv)
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else f"cpu ({torch.get_num_threads()} threads)",
        "host": platform.node(), "torch": torch.__version__, "transformers": transformers.__version__,
        "python": sys.version.split()[0], "argv": sys.argv[1:] if argv is None else argv, "rows": []}
    print(result["device"])
    print(f"{'drafter':8} {'mode':13} {'seconds':>9} {'speedup':>8} {'decodes':>7} {'tokens/s':>9} {'τ greedy':>11} "
          f"{'τ samp':>7} {'same':>5}", flush=True)
    for architecture in args.architectures:
        work = run_workload(args.run, architecture, device) if args.run else shape_workload(args, architecture, device)
        result["workload"] = work.facts | {"suites": {k: len(v) for k, v in work.suites.items()},
                                           "max_new_tokens": work.max_new_tokens, "seeds": work.seeds}
        warm = Workload(work.target, work.drafters, {k: v[:2] for k, v in work.suites.items()}, 8, work.stops,
                        work.sampling, min(work.seeds, 1))
        first, base = None, None
        for mode in args.modes:
            decode_all(warm, mode)
            decoded = decode_all(work, mode)
            row = _row(work, architecture, mode, decoded, base)
            base = base or (decoded["results"] if mode == "batch1" else None)
            _print(row, first)
            first = first or row
            result["rows"].append(row)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n")
        del work
        if device == "cuda":
            torch.cuda.empty_cache()
    return result


if __name__ == "__main__":
    main()
