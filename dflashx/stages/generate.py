"""Generate: run the target on every ingested prompt and write completions, resumably.

Reads `ingest.prompts`, skips the ids already in `completions/` (a torn last line from a kill is
truncated first), and sends the rest through the recipe's backend (`sglang` over HTTP, or
`transformers` in-process). Completions are appended to `completions/shard-NNNNN.jsonl` and fsync'ed
every `flush_every` records. A rich progress bar shows rate, output tokens/s and ETA; metrics
(output tokens/s, finish_reason=length rate, retries, errors, mean token counts) go to `ctx.log`
every `LOG_EVERY_S` seconds and at the end, and into the stage result. Prompts that still fail
after every retry are not written: the stage then fails, and rerunning resumes with just those.
A disk that fills stops the stage (`StageFailed`: the folder, the space free and the space the
plan says is still needed); the fsync'ed batches stay, and rerunning resumes after them.
With `max_prompts` (the folder holds that many) or `max_minutes` (no new prompt after them) the stage
stops early: its result is `unfinished`, the orchestrator leaves `_STARTED` and no `_SUCCESS`, and the
next attempt (the full run, after `dflashx pilot`) resumes after those completions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import nullcontext
from itertools import islice
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

from dflashx.backends.base import Backend, rejected_record
from dflashx.backends.context_gate import ContextGate, open_gate
from dflashx.backends.sglang import SGLangBackend
from dflashx.backends.vllm import VLLMBackend
from dflashx.targets.locate import locate_target, locate_tokenizer
from dflashx.data.jsonl import ShardWriter, count_records, iter_shards
from dflashx.stages.graph import input_name
from dflashx.stages.servers import launch_args
from dflashx.stages.base import Artifact, GenerateContext, StageFailed, StageResult
from dflashx.store.diskspace import DiskFull, size_text, used_bytes

LOG_EVERY_S = 30.0
SERVER_BACKENDS = {"sglang": SGLangBackend, "vllm": VLLMBackend}


def make_backend(ctx: GenerateContext) -> Backend:
    """The backend the recipe names, configured from the recipe and the plan's launch plan."""
    cfg = ctx.config
    target = ctx.recipe.target
    if cfg.serving.mode == "in-process":
        from dflashx.backends.transformers_local import TransformersBackend
        from dflashx.dflash.fp8 import target_to_fp8

        return TransformersBackend(locate_target(target), locate_tokenizer(target), cfg,
                                   target.chat_template, target.load_precision, to_fp8=target_to_fp8)
    engine = SERVER_BACKENDS[cfg.backend]
    return engine(cfg, target.chat_template, target.model, ctx.runtime.launch, ctx.out_dir,
                  launch_args=launch_args(ctx.recipe))


class GenerationMeter:
    """Counts what this session wrote and shows it as a progress bar."""

    def __init__(self, total: int, done: int, progress: Progress, startup_s: float = 0.0):
        self.started = time.monotonic()
        self.startup_s = startup_s
        self.written = 0
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.length = 0
        self.progress = progress
        self.logged_at = self.started
        self.task = progress.add_task("generate", total=total, completed=done, rate=0.0, tok_s=0.0)

    def add(self, record: dict[str, Any]) -> None:
        self.written += 1
        self.prompt_tokens += record["usage"]["prompt_tokens"]
        self.output_tokens += record["usage"]["completion_tokens"]
        self.length += record["finish_reason"] == "length"
        elapsed = self.elapsed()
        self.progress.update(self.task, advance=1, rate=self.written / elapsed, tok_s=self.output_tokens / elapsed)

    def log_due(self) -> bool:
        """True once every LOG_EVERY_S seconds (the caller then logs the metrics)."""
        now = time.monotonic()
        if now - self.logged_at < LOG_EVERY_S:
            return False
        self.logged_at = now
        return True

    def elapsed(self) -> float:
        return max(time.monotonic() - self.started, 1e-9)

    def metrics(self) -> dict[str, Any]:
        n = max(self.written, 1)
        return {
            "completions_written": self.written,
            "output_tokens": self.output_tokens,
            "output_tokens_per_s": self.output_tokens / self.elapsed(),
            "records_per_s": self.written / self.elapsed(),
            "finish_length_frac": self.length / n,
            "prompt_tokens_mean": self.prompt_tokens / n,
            "output_tokens_mean": self.output_tokens / n,
            "wall_s": self.elapsed(),
            "startup_s": self.startup_s,
        }


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
        TextColumn("{task.fields[rate]:,.1f}/s"), TextColumn("{task.fields[tok_s]:,.0f} tok/s"),
        TextColumn("ETA"), TimeRemainingColumn(),
    )




def serve_only(backend: Backend) -> StageFailed:
    """Node K > 0 of a multi-node generation: start its servers, keep them up for node 0 (which sends the
    prompts and writes the completions) until one stops; the stop, as the stage's failure."""
    with backend:
        stopped = backend.serve()
    return StageFailed(f"this node only serves generation for node 0, which writes the completions; {stopped}. "
                       "Restart this command to serve again while node 0 generates.")


def _until(items: Iterator[dict[str, Any]], minutes: float | None) -> Iterator[dict[str, Any]]:
    """The items, until `minutes` have passed since the first was taken (the backend pulls lazily)."""
    deadline = None
    for item in items:
        now = time.monotonic()
        deadline = deadline or (now + minutes * 60 if minutes else math.inf)
        if now > deadline:
            return
        yield item


def run(ctx: GenerateContext) -> StageResult:
    """Complete every ingested prompt not yet in `completions/`; with `max_prompts` / `max_minutes` (the
    pilot's) only until the folder holds that many or the time is up: then the result is `unfinished`."""
    cfg = ctx.config
    prompts_dir = ctx.inputs[input_name("generate")]
    total = count_records(prompts_dir)
    backend = make_backend(ctx)
    if not backend.drives:
        raise serve_only(backend)
    try:
        with ShardWriter(ctx.out_dir / "completions", cfg.shard_size, cfg.flush_every) as writer:
            room = total if cfg.max_prompts is None else max(min(cfg.max_prompts, total) - len(writer.ids), 0)
            todo = _until(islice((p for p in iter_shards(prompts_dir) if p["id"] not in writer.ids), room),
                          cfg.max_minutes)
            gate = open_gate(ctx.recipe.target, cfg.max_tokens, cfg.context_length)
            started = time.monotonic()
            with _progress() as progress, (backend if room else nullcontext()):  # at its limit: no server
                meter = GenerationMeter(total, writer.resumed, progress, startup_s=time.monotonic() - started)

                def emit(record: dict[str, Any]) -> None:
                    if writer.write(record):
                        meter.add(record)
                        if meter.log_due():
                            ctx.log(_metrics(meter, backend, writer, total, gate), step=len(writer.ids))

                def refuse(prompt: dict[str, Any], tokens: int, error: str) -> None:
                    emit(rejected_record(prompt, error, backend.name, prompt_tokens=tokens))

                if room:
                    backend.generate(gate.admit(todo, refuse) if gate else todo, emit)
    except DiskFull as e:
        raise StageFailed(str(_still_needed(e, ctx))) from e
    metrics = _metrics(meter, backend, writer, total, gate)
    ctx.log(metrics, step=len(writer.ids))
    if backend.stats.failed:
        raise StageFailed(
            f"{backend.stats.failed} prompts failed after {cfg.retries} retries (first: {backend.stats.first_error}). "
            f"The {len(writer.ids)} completions written are kept: rerun to retry only the missing prompts.",
            metrics,
        )
    limited = cfg.max_prompts is not None or cfg.max_minutes is not None
    left = total - len(writer.ids) if limited else 0
    return StageResult(
        artifacts={"completions": Artifact("completions", description="Target completions, JSONL shards")},
        metrics=metrics,
        unfinished=f"{len(writer.ids)} of {total} prompts completed (stages.generate.max_prompts / max_minutes); "
                   "the next attempt resumes after them" if left > 0 else None,
    )


def _still_needed(e: DiskFull, ctx: GenerateContext) -> DiskFull:
    """The stop restated with the plan's storage for this stage less what the folder holds."""
    planned = ctx.runtime.estimates.storage_bytes
    have = used_bytes(e.folder)
    if planned <= have:
        return e
    return e.restated(planned - have, f"to finish: the plan's {size_text(planned)} for generate, "
                                      f"{size_text(have)} written")


def _metrics(meter: GenerationMeter, backend: Backend, writer: ShardWriter, total: int,
             gate: ContextGate | None) -> dict[str, Any]:
    refused = gate.refused if gate else 0
    return {
        **meter.metrics(),
        "completions_total": len(writer.ids),
        "completions_resumed": writer.resumed,
        "prompts_total": total,
        "retries": backend.stats.retries,
        "errors": backend.stats.failed + backend.stats.rejected + refused,
        "failed": backend.stats.failed,
        "rejected": backend.stats.rejected + refused,
        "refused_too_long": refused,
        "torn_bytes_truncated": writer.truncated_bytes,
        "server_restarts": backend.stats.server_restarts,
        **({"spec_accept_length": backend.stats.spec_accept_length}
           if backend.stats.spec_accept_length is not None else {}),
    }
