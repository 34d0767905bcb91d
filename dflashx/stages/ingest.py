"""Ingest: recipe sources -> normalised, de-duplicated, shuffled prompt shards and an eval holdout.

Per source: read raw records, map them to chat messages (`dflashx.data.formats`), give each a
content-hash id, drop exact duplicates (within the source and against earlier sources), order by a
seeded hash of the id and keep the first `cap`. The order is a function of (seed, id) only, so
adding a source or reordering a file does not reshuffle the others. All kept prompts are then
ordered the same way; the first `dataset.eval_holdout` become `eval_prompts.jsonl` (never trained
on) and the rest are written as `prompts/shard-NNNNN.jsonl` of `stages.ingest.shard_size` records.

Metrics: per source `read`, `kept`, `deduped`, `capped`, `malformed` and `malformed_lines` (the
first offending locations); totals `prompts`, `eval_prompts`, `shards`.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from dataclasses import asdict, dataclass, field
from itertools import islice
from typing import Iterator

from dflashx.config.schema import DatasetSpec, SourceSpec
from dflashx.data.formats import FormatError, sample_id, to_prompt
from dflashx.data.jsonl import dumps, shard_path, write_lines_atomic
from dflashx.data.sources import SourceError, iter_source
from dflashx.stages.base import Artifact, IngestContext, StageResult

log = logging.getLogger(__name__)
MAX_REPORTED_LINES = 10


@dataclass
class SourceCounts:
    read: int = 0
    kept: int = 0
    deduped: int = 0
    capped: int = 0
    malformed: int = 0
    malformed_lines: list[str] = field(default_factory=list)
    first_error: str | None = None


@dataclass(order=True, slots=True)
class Keyed:
    """A prompt record as a JSONL line, ordered by its seeded rank (then id)."""

    rank: bytes
    id: str
    line: str = field(compare=False)


def shuffle_rank(seed: int, sid: str) -> bytes:
    """The seeded shuffle key of a sample id (independent of input order)."""
    return hashlib.sha256(f"{seed}:{sid}".encode()).digest()[:8]


def read_source(source: SourceSpec, dataset: DatasetSpec, seen: set[str]) -> tuple[SourceCounts, list[Keyed]]:
    """Normalise, de-duplicate, shuffle and cap one source; `seen` holds ids kept by earlier sources."""
    counts = SourceCounts()
    local: dict[str, int] = {}
    items: list[Keyed] = []
    for raw in iter_source(source):
        counts.read += 1
        try:
            if raw.error:
                raise FormatError(raw.error)
            prompt = to_prompt(raw.data, source.format, source.fields, source.system_prompt)
        except FormatError as e:
            counts.malformed += 1
            if len(counts.malformed_lines) < MAX_REPORTED_LINES:
                counts.malformed_lines.append(raw.where)
            counts.first_error = counts.first_error or f"{raw.where}: {e}"
            continue
        sid = sample_id(prompt)
        if sid in seen or sid in local:
            if dataset.dedupe:
                counts.deduped += 1
                continue
            local[sid] = local.get(sid, 0) + 1
            sid = f"{sid}-{local[sid]}"
        local.setdefault(sid, 0)
        record = {"id": sid, "source": source.name, **prompt}
        items.append(Keyed(shuffle_rank(dataset.shuffle_seed, sid), sid, dumps(record)))
    _check_usable(source, counts)
    items.sort()
    if source.cap is not None and len(items) > source.cap:
        counts.capped = len(items) - source.cap
        del items[source.cap:]
    counts.kept = len(items)
    seen.update(item.id for item in items)
    return counts, items


def _check_usable(source: SourceSpec, counts: SourceCounts) -> None:
    where = f"dataset.sources[{source.name}]"
    if counts.read == 0:
        raise SourceError(f"source {source.name!r} ({source.path or source.hf_id}) holds no records (fix {where})")
    if counts.malformed == counts.read:
        raise SourceError(
            f"source {source.name!r}: all {counts.read} records are malformed; first: {counts.first_error}. "
            f"Check {where}.format (now {source.format!r}) and {where}.fields."
        )
    if counts.malformed:
        log.warning("source %s: %d malformed records skipped; first: %s",
                    source.name, counts.malformed, counts.first_error)


def _batches(items: list[Keyed], size: int) -> Iterator[list[Keyed]]:
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


def run(ctx: IngestContext) -> StageResult:
    dataset = ctx.recipe.dataset
    seen: set[str] = set()
    per_source: dict[str, SourceCounts] = {}
    kept: list[Keyed] = []
    for source in dataset.sources:
        counts, items = read_source(source, dataset, seen)
        per_source[source.name] = counts
        kept.extend(items)
    kept.sort()
    if dataset.eval_holdout >= len(kept):
        raise SourceError(
            f"dataset.eval_holdout is {dataset.eval_holdout} but only {len(kept)} prompts were kept; "
            f"lower dataset.eval_holdout or add prompts"
        )
    holdout, train = kept[: dataset.eval_holdout], kept[dataset.eval_holdout:]

    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    eval_path = ctx.out_dir / "eval_prompts.jsonl"
    write_lines_atomic(eval_path, (k.line for k in holdout))
    partial = ctx.out_dir / "prompts.partial"
    shutil.rmtree(partial, ignore_errors=True)
    shards = 0
    for shards, batch in enumerate(_batches(train, ctx.config.shard_size), start=1):
        write_lines_atomic(shard_path(partial, shards - 1), (k.line for k in batch))
    final = ctx.out_dir / "prompts"
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)

    metrics = {
        "prompts": len(train),
        "eval_prompts": len(holdout),
        "shards": shards,
        "malformed": sum(c.malformed for c in per_source.values()),
        "deduped": sum(c.deduped for c in per_source.values()),
        "sources": {name: asdict(c) for name, c in per_source.items()},
    }
    ctx.log({k: v for k, v in metrics.items() if k != "sources"})
    return StageResult(
        artifacts={
            "prompts": Artifact("prompts", description="Normalised prompts, JSONL shards"),
            "eval_prompts": Artifact("eval_prompts.jsonl", description="Held-out prompts, never trained on"),
        },
        metrics=metrics,
    )

