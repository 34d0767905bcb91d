"""Ingest and generate-client benchmark.

    python benchmarks/ingest_generate.py                  # 200K prompts, 4K requests (~1 min on 2 cores)
    python benchmarks/ingest_generate.py --prompts 50000  # quicker

- ingest: synthetic sources of realistic prompt sizes (~1.2 KB, the seeds' mean; alpaca + sharegpt +
  1% exact duplicates) through the stage; prompts/s and peak RSS at 10% and 100% of the prompts
  (each in a fresh subprocess). Ingest holds every kept prompt in memory (dedupe and a global
  seeded order need them), so RSS grows with the prompt count: the table gives bytes per prompt.
- generate client: the sglang backend (asyncio + httpx) against the scripted OpenAI server on
  loopback (its own process, launched as a plan's server would be) answering at once; requests/s
  is a floor on the client's capacity (the Python server is the slower side). A 27B target on one
  node produces roughly 5-50 completions/s.
Prints a table and writes benchmarks/results/ingest_generate.json.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# benchmarks/tokenize.py would shadow the stdlib `tokenize`: keep this folder off the import path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT / "tests"))


def make_sources(folder: Path, n: int) -> list[dict]:
    rng = random.Random(0)
    words = ["the", "of", "and", "to", "in", "is", "for", "on", "that", "with", "as", "by", "this", "from", "code",
             "data", "model", "train", "run", "test"]

    def text(k: int) -> str:
        return " ".join(rng.choice(words) for _ in range(k))

    half = n // 2
    with (folder / "alpaca.jsonl").open("w") as f:
        for i in range(half):
            row = {"system_prompt": text(20), "question": f"{i} {text(180)}", "response": text(50)}
            f.write(json.dumps(row) + "\n")
    with (folder / "sharegpt.jsonl").open("w") as f:
        for i in range(n - half):
            j = i if rng.random() > 0.01 else 0  # ~1% exact duplicates
            conv = [{"from": "human", "value": f"{j} {text(100)}"}, {"from": "gpt", "value": text(40)},
                    {"from": "human", "value": f"{j} {text(60)}"}, {"from": "gpt", "value": text(40)}]
            f.write(json.dumps({"conversations": conv}) + "\n")
    return [{"name": "alpaca", "path": str(folder / "alpaca.jsonl"), "format": "alpaca",
             "fields": {"prompt": "question", "system": "system_prompt"}},
            {"name": "sharegpt", "path": str(folder / "sharegpt.jsonl"), "format": "sharegpt"}]


def ingest_child(folder: Path, n: int) -> dict:
    """Run ingest in this process (a fresh subprocess) and report time and peak RSS."""
    from helpers_models import make_recipe, stage_context

    from dflashx.stages import ingest

    sources = make_sources(folder, n)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    recipe = make_recipe(sources, dataset={"sources": sources, "eval_holdout": 512})
    t0 = time.perf_counter()
    result = ingest.run(stage_context("ingest", recipe, folder / "run"))
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    kept = result.metrics["prompts"] + result.metrics["eval_prompts"]
    return {"prompts_in": n, "prompts_kept": kept, "seconds": seconds, "prompts_per_s": n / seconds,
            "peak_rss_bytes": peak, "rss_growth_bytes_per_prompt": (peak - base_rss) / n}


def run_ingest(n: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, __file__, "--ingest-child", tmp, str(n)],
                             capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_client(requests: int, concurrency: int) -> dict:
    from dflashx.backends.sglang import SGLangBackend
    from dflashx.config.schema import ChatTemplateSpec, GenerateStage

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = {"command": [sys.executable, str(ROOT / "tests" / "openai_server.py"), "--port", str(port)], "port": port}
    prompts = [{"id": str(i), "messages": [{"role": "user", "content": f"prompt {i}"}]} for i in range(requests)]
    out: list[dict] = []
    with tempfile.TemporaryDirectory() as logs:
        cfg = GenerateStage(concurrency=concurrency, server_startup_timeout_s=30)
        with SGLangBackend(cfg, ChatTemplateSpec(), "m", [server], Path(logs)) as backend:
            t0 = time.perf_counter()
            backend.generate(prompts, out.append)
            seconds = time.perf_counter() - t0
    assert len(out) == requests
    return {"requests": requests, "concurrency": concurrency, "seconds": seconds, "requests_per_s": requests / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=200_000)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--ingest-child", nargs=2, metavar=("DIR", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ingest_child:
        print(json.dumps(ingest_child(Path(args.ingest_child[0]), int(args.ingest_child[1]))))
        return

    small, full = run_ingest(args.prompts // 10), run_ingest(args.prompts)
    client = run_client(args.requests, args.concurrency)
    rows = [
        ("ingest prompts/s", f"{small['prompts_per_s']:,.0f}", f"{full['prompts_per_s']:,.0f}"),
        ("ingest peak RSS (MB)", f"{small['peak_rss_bytes'] / 1e6:,.0f}", f"{full['peak_rss_bytes'] / 1e6:,.0f}"),
        ("ingest RSS growth (bytes/prompt)", f"{small['rss_growth_bytes_per_prompt']:,.0f}",
         f"{full['rss_growth_bytes_per_prompt']:,.0f}"),
    ]
    print(f"{'measure':36} {small['prompts_in']:>12,} {full['prompts_in']:>12,}")
    for name, a, b in rows:
        print(f"{name:36} {a:>12} {b:>12}")
    print(f"generate client: {client['requests_per_s']:,.0f} requests/s "
          f"({client['requests']} requests, concurrency {client['concurrency']}, scripted server, no delay)")
    seeds = 914_000 / full["prompts_per_s"]
    print(f"implied ingest time for the seeds' 914K prompts: {seeds:,.0f} s, "
          f"~{full['rss_growth_bytes_per_prompt'] * 914_000 / 1e9:,.1f} GB of RSS")
    results = ROOT / "benchmarks" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "ingest_generate.json").write_text(json.dumps(
        {"ingest_small": small, "ingest_full": full, "client": client, "seeds_ingest_seconds": seeds}, indent=2) + "\n")


if __name__ == "__main__":
    main()
