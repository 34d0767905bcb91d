"""Read one recipe source as a stream of raw records, each with where it came from.

Local files: `.jsonl` (one object per line), `.json` (a JSON array, or JSON lines), `.parquet`
(read in record batches with pyarrow), or a folder of those. `builtin:` paths are located by
`dflashx.targets.locate.builtin_file`. `hf_id` sources stream through `datasets.load_dataset` (needs a
network or a warm `datasets` cache). A line that is not JSON is yielded as a `RawRecord` with
`error` set, so the caller counts it as malformed with its line number instead of stopping.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from dflashx.config.schema import SourceSpec
from dflashx.targets.locate import builtin_file, is_builtin

SUFFIXES = (".jsonl", ".json", ".parquet")


class SourceError(ValueError):
    """A source cannot be read at all (missing file, unsupported type): the message says the fix."""


@dataclass
class RawRecord:
    where: str  # "file.jsonl:12" (1-based line) or "file.parquet#row 3" or "hf_id#row 3"
    data: Any = None
    error: str | None = None


def _key(spec: SourceSpec, key: str | None) -> str:
    """The recipe key that wrote `spec` (its list item), for error messages."""
    return key or f"dataset.sources[{spec.name}]"


def source_files(spec: SourceSpec, key: str | None = None) -> list[Path]:
    """The local files a `path` source reads, in a stable order; `key` names the recipe item that
    wrote it in errors (default `dataset.sources[<name>]`)."""
    assert spec.path is not None
    if is_builtin(spec.path):
        return [builtin_file(spec.path)]
    path = Path(spec.path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
        if not files:
            raise SourceError(
                f"source {spec.name!r}: folder {path} holds no {'/'.join(SUFFIXES)} files "
                f"(fix {_key(spec, key)}.path)"
            )
        return files
    if not path.exists():
        raise SourceError(f"source {spec.name!r}: {path} does not exist (fix {_key(spec, key)}.path)")
    if path.suffix not in SUFFIXES:
        raise SourceError(
            f"source {spec.name!r}: {path} is not one of {', '.join(SUFFIXES)} "
            f"(convert it, or point {_key(spec, key)}.path at such a file)"
        )
    return [path]


def iter_source(spec: SourceSpec, key: str | None = None) -> Iterator[RawRecord]:
    """Every raw record of a source, in file order (`key` as for `source_files`)."""
    if spec.hf_id is not None:
        yield from _iter_hub(spec, _key(spec, key))
        return
    for path in source_files(spec, key):
        if path.suffix == ".parquet":
            yield from _iter_parquet(path)
        else:
            yield from _iter_json(path)


def _iter_json(path: Path) -> Iterator[RawRecord]:
    with path.open("rb") as f:
        head = f.read(64).lstrip()
    if path.suffix == ".json" and head.startswith(b"["):
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            yield RawRecord(f"{path}:{getattr(e, 'lineno', 1)}", error=f"not valid JSON: {e}")
            return
        for i, row in enumerate(rows):
            yield RawRecord(f"{path}#item {i}", row)
        return
    with path.open("rb") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield RawRecord(f"{path}:{lineno}", json.loads(line))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                yield RawRecord(f"{path}:{lineno}", error=f"not valid JSON: {e}")


def _iter_parquet(path: Path) -> Iterator[RawRecord]:
    import pyarrow.parquet as pq

    row = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
        for item in batch.to_pylist():
            yield RawRecord(f"{path}#row {row}", item)
            row += 1


def _iter_hub(spec: SourceSpec, key: str) -> Iterator[RawRecord]:
    import datasets

    try:
        ds = datasets.load_dataset(spec.hf_id, spec.hf_config, split=spec.split, streaming=True)
    except Exception as e:  # the datasets library raises many types; all mean "cannot open"
        raise SourceError(
            f"source {spec.name!r}: cannot open datasets id {spec.hf_id!r} (split {spec.split!r}): {e}. "
            f"Without a network, download it elsewhere and use `path:` ({key}.path) with a local JSONL/Parquet file."
        ) from e
    for i, item in enumerate(ds):
        yield RawRecord(f"{spec.hf_id}#row {i}", item)
