"""Tokenize-stage benchmark: stage vs naive apply_chat_template loop vs the raw batch encoder.

    python benchmarks/tokenize.py                 # 100K samples (the issue's figure), ~10 min on 2 cores
    python benchmarks/tokenize.py --samples 20000 # quicker

One run measures, on synthetic completions of realistic length (long reasoning, ~2K tokens each):
- the stage (`tokenize_completions`, num_proc = cores) end to end: JSONL in, Arrow dataset out;
- the naive loop: `apply_chat_template(tokenize=True)` per sample, once whole and once for the
  prompt (the usual way to find the mask), single process;
- the raw `tokenizers` batch encoder (`encode_batch`, and `encode_batch_fast` without offsets) on
  the same rendered texts — the floor of this stage;
- peak RSS of the stage at 10% of the samples and at all of them (each in a fresh subprocess).
Prints a table and writes benchmarks/results/tokenize.json, with the 902K-sample / 1.87B-token time
those rates imply per core.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is named like the stdlib `tokenize`: keep its folder off the import path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import tempfile
import threading
import time
from itertools import islice
from typing import Iterator

os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "tokenize.json"
SEED_SAMPLES, SEED_TOKENS = 902_087, 1.87e9
VOCAB = 32_000
WORDS = (  # noqa: SIM905 (a word list reads best as one string)
    "the of and to in is that for it as with was on be by this are or from at an which have not had "
    "but what all were when we there can more if has will one about so some them would other into than "
    "then its only two time these may first new like very also any after could see out way each over "
    "most know think step answer therefore compute value number check wait let second sum total carry "
    "digit result because function return variable array index loop condition matrix vector integral "
    "derivative equation solve prove assume suppose hence thus case consider note given list string "
    "python code output input error test example problem approach method algorithm complexity"
).split()
PUNCT = [".", ",", "?", ":", "\n", "\n\n", " (", ")", " =", " +", " *", "`"]


def word_pool(n: int, seed: int) -> list[str]:
    """A long token soup (words, numbers, punctuation, newlines) to cut samples from."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r = rng.random()
        out.append(str(rng.randint(0, 99999)) if r < 0.07
                   else rng.choice(WORDS) + rng.choice(["", "s", "ed", "ing", "", ""]))
        if r > 0.86:
            out.append(rng.choice(PUNCT))
    return out


def make_records(n: int, seed: int = 0) -> Iterator[dict]:
    """Completions with ~1.1K-word reasoning, ~150-word answers and ~120-word prompts (lognormal)."""
    rng = random.Random(seed)
    pool = word_pool(400_000, seed)

    def cut(mean_words: float) -> str:
        k = max(1, min(len(pool) - 1, int(rng.lognormvariate(0, 0.5) * mean_words)))
        start = rng.randrange(0, len(pool) - k)
        return " ".join(pool[start:start + k])

    return ({
        "id": f"b{i:07d}", "source": f"src{i % 4}",
        "messages": [{"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": cut(120)}],
        "reasoning": cut(1100), "answer": cut(150), "finish_reason": "stop",
        "usage": {"prompt_tokens": 0, "completion_tokens": 0},
    } for i in range(n))


def write_shards(n: int, folder: Path, shard_size: int = 10_000) -> None:
    """Stream n synthetic completions into JSONL shards (no list of all records in memory)."""
    from dflashx.data.jsonl import shard_path, write_jsonl_atomic

    records = make_records(n)
    for index in range(-(-n // shard_size)):
        write_jsonl_atomic(shard_path(folder, index), islice(records, shard_size))


def train_bench_tokenizer(folder: Path) -> Path:
    from dflashx.tiny.tokenizer import train_tokenizer

    if not (folder / "tokenizer.json").exists():
        pool = word_pool(3_000_000, 123)
        texts = [" ".join(pool[i:i + 300]) for i in range(0, len(pool), 300)]
        train_tokenizer(texts, vocab_size=VOCAB, out_dir=folder)
    return folder


class MemorySampler:
    """Peak memory of this process and its workers, sampled every 0.1 s: resident (RSS, which also
    counts memory-mapped Arrow pages the kernel may drop) and private (RSS - file-backed/shared)."""

    def __init__(self) -> None:
        import psutil

        self.proc = psutil.Process()
        self.peak = {"rss_main_mib": 0.0, "private_main_mib": 0.0, "private_worker_mib": 0.0,
                     "private_total_mib": 0.0, "rss_total_mib": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        import psutil

        rows = []
        for p in [self.proc, *self.proc.children(recursive=True)]:
            try:
                m = p.memory_info()
            except psutil.Error:
                continue
            rows.append((p.pid == self.proc.pid, m.rss / 2**20, (m.rss - m.shared) / 2**20))
        now = {
            "rss_main_mib": sum(r for main, r, _ in rows if main),
            "private_main_mib": sum(a for main, _, a in rows if main),
            "private_worker_mib": max([a for main, _, a in rows if not main], default=0.0),
            "private_total_mib": sum(a for _, _, a in rows),
            "rss_total_mib": sum(r for _, r, _ in rows),
        }
        self.peak = {k: max(v, now[k]) for k, v in self.peak.items()}

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self._sample()

    def __enter__(self) -> "MemorySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_stage(work: Path, tokenizer: Path, n: int, num_proc: int) -> dict:
    """Child process: run the stage on n prepared completions; report time, tokens and peak memory."""
    from dflashx.stages.tokenize import TokenizePolicy, tokenize_completions

    completions = work / f"completions-{n}"
    with MemorySampler() as memory:
        t0 = time.perf_counter()
        metrics = tokenize_completions(completions, work / f"out-{n}", tokenizer,
                                       TokenizePolicy(max_length=1 << 20, overflow="truncate", min_loss_tokens=32),
                                       num_proc=num_proc)
        seconds = time.perf_counter() - t0
    return {"samples": n, "seconds": seconds, "tokens": metrics["tokens"], "tokens_per_s": metrics["tokens"] / seconds,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "peak_rss_children_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            **memory.peak}


def stage_in_subprocess(work: Path, tokenizer: Path, n: int, num_proc: int) -> dict:
    write_shards(n, work / f"completions-{n}")
    cmd = [sys.executable, __file__, "--child", str(n), "--work", str(work), "--num-proc", str(num_proc)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    return json.loads(out.strip().splitlines()[-1])


def naive_and_raw(tokenizer_dir: Path, n: int) -> dict:
    """Naive per-sample loop and the raw batch encoders, on the same n samples."""
    from transformers import AutoTokenizer

    from dflashx.data.chat_mask import completion_messages

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    convs = [completion_messages(r) for r in make_records(n, seed=1)]
    t0 = time.perf_counter()
    naive_tokens = 0
    for conv in convs:
        whole = tok.apply_chat_template(conv, tokenize=True, return_dict=False)
        tok.apply_chat_template(conv[:-1], tokenize=True, add_generation_prompt=True, return_dict=False)
        naive_tokens += len(whole)
    naive_s = time.perf_counter() - t0
    texts = [tok.apply_chat_template(conv, tokenize=False) for conv in convs]
    out = {"samples": n, "naive_tokens_per_s": naive_tokens / naive_s}
    backend = tok.backend_tokenizer
    for name in ("encode_batch", "encode_batch_fast"):
        encode = getattr(backend, name)
        t0 = time.perf_counter()
        total = 0
        for i in range(0, len(texts), 1000):
            total += sum(len(e.ids) for e in encode(texts[i:i + 1000], add_special_tokens=False))
        out[f"raw_{name}_tokens_per_s"] = total / (time.perf_counter() - t0)
    out["tokens"] = total
    return out


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--compare-samples", type=int, default=10_000, help="Samples for the naive and raw runs.")
    ap.add_argument("--num-proc", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--work", type=Path, default=None, help="Scratch folder (default: a temporary one).")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="dflashx-bench-tok-"))
    tokenizer = train_bench_tokenizer(work / "tokenizer")
    if args.child is not None:
        print(json.dumps(run_stage(work, tokenizer, args.child, args.num_proc)))
        return
    small = stage_in_subprocess(work, tokenizer, max(1, args.samples // 10), args.num_proc)
    large = stage_in_subprocess(work, tokenizer, args.samples, args.num_proc)
    ref = naive_and_raw(tokenizer, args.compare_samples)
    cores = args.num_proc
    raw = ref["raw_encode_batch_tokens_per_s"]
    rows = [
        ("stage (num_proc=%d, end to end)" % cores, large["tokens_per_s"]),
        ("naive apply_chat_template loop (1 process)", ref["naive_tokens_per_s"]),
        ("raw tokenizers encode_batch (all cores)", raw),
        ("raw tokenizers encode_batch_fast (all cores)", ref["raw_encode_batch_fast_tokens_per_s"]),
    ]
    result = {
        "cpu": _cpu_model(), "cpus_usable": len(os.sched_getaffinity(0)), "num_proc": cores, "vocab_size": VOCAB,
        "stage": large, "stage_small": small, "reference": ref,
        "stage_vs_raw": large["tokens_per_s"] / raw,
        "stage_vs_raw_fast": large["tokens_per_s"] / ref["raw_encode_batch_fast_tokens_per_s"],
        "stage_vs_naive": large["tokens_per_s"] / ref["naive_tokens_per_s"],
        "stage_vs_naive_per_core": large["tokens_per_s"] / cores / ref["naive_tokens_per_s"],
        "rss_ratio_large_vs_small": large["peak_rss_mib"] / small["peak_rss_mib"],
        "private_ratio_large_vs_small": large["private_total_mib"] / small["private_total_mib"],
        "seed_hours_per_core": SEED_TOKENS / (large["tokens_per_s"] / cores) / 3600,
        "seed_hours_on_this_machine": SEED_TOKENS / large["tokens_per_s"] / 3600,
    }
    print(f"\nsynthetic completions, ~{large['tokens'] / large['samples']:.0f} tokens each, vocab {VOCAB}")
    print(f"{'measure':48s} {'tokens/s':>12s} {'per core':>12s}")
    for name, rate in rows:
        per_core = rate / (1 if "1 process" in name else cores)
        print(f"{name:48s} {rate:12,.0f} {per_core:12,.0f}")
    print(f"\nstage / raw encode_batch      {result['stage_vs_raw']:.2f}  (goal >= 0.80)")
    print(f"stage / raw encode_batch_fast {result['stage_vs_raw_fast']:.2f}")
    print(f"stage / naive                 {result['stage_vs_naive']:.2f}  (goal >= 2; per core "
          f"{result['stage_vs_naive_per_core']:.2f})")
    for run in (small, large):
        print(f"at {run['samples']:>7,} samples: peak RSS main {run['peak_rss_mib']:6.0f} MiB, largest worker "
              f"{run['peak_rss_children_mib']:6.0f} MiB; private memory, all processes "
              f"{run['private_total_mib']:6.0f} MiB ({run['seconds']:.0f} s)")
    print(f"902K samples / 1.87B tokens: {result['seed_hours_per_core']:.2f} h per core, "
          f"{result['seed_hours_on_this_machine']:.2f} h on this machine ({cores} processes)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2))
    os.replace(tmp, RESULTS)
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
