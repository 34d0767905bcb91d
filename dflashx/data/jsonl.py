"""JSONL shards: atomic whole-file writes, and an append-only, fsync'ed, resumable shard writer.

A folder of shards is `shard-00000.jsonl`, `shard-00001.jsonl`, ... with one JSON object per line,
each carrying a unique `"id"`. `ShardWriter` appends records in batches (write, flush, fsync every
`flush_every` records), so a kill loses at most the unflushed batch. Reopening the folder scans the
shards, collects the ids already written (the caller skips them) and truncates a torn last line
left by a kill in the middle of a write. A bad line anywhere but at the end is corruption, not a
torn write, and raises. A disk that fills during a flush stops the writer with `DiskFull`
(`dflashx.store.diskspace`) after cutting the shard back to its last fsync'ed batch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

from dflashx.store.atomic import atomic_open
from dflashx.store.diskspace import stop_when_full

SHARD_GLOB = "shard-*.jsonl"


class CorruptShardError(RuntimeError):
    """A shard has an unreadable line before its last one (not a torn write): move it aside."""


def shard_path(folder: Path, index: int) -> Path:
    return folder / f"shard-{index:05d}.jsonl"


def shard_paths(folder: str | Path) -> list[Path]:
    """The shards of a folder in order (a single .jsonl file is its own one shard)."""
    folder = Path(folder)
    return [folder] if folder.is_file() else sorted(folder.glob(SHARD_GLOB))


def iter_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """Records of one JSONL file (blank lines skipped)."""
    with Path(path).open("rb") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


class JsonlLineError(ValueError):
    """A line of a JSONL file is not JSON; the message names the file and line."""


def iter_numbered(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, record) for each non-blank line of a JSONL file; a line that is not JSON
    raises `JsonlLineError` naming `file:line`."""
    with Path(path).open("rb") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise JsonlLineError(f"{path}:{lineno}: not JSON ({e.msg}); fix or remove the line") from e


def iter_shards(folder: str | Path) -> Iterator[dict[str, Any]]:
    """Records of every shard of a folder, in shard order."""
    for path in shard_paths(folder):
        yield from iter_jsonl(path)


def count_records(folder: str | Path) -> int:
    """Number of non-blank lines over a folder's shards (no JSON parsing)."""
    total = 0
    for path in shard_paths(folder):
        with path.open("rb") as f:
            total += sum(1 for line in f if line.strip())
    return total


def dumps(record: dict[str, Any]) -> str:
    """One JSONL line (no trailing newline): compact, UTF-8 kept readable."""
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def write_jsonl_atomic(path: str | Path, records: Iterable[dict[str, Any]]) -> int:
    """Write records to `path` through a temporary file and `os.replace`; return the count."""
    return write_lines_atomic(path, (dumps(r) for r in records))


def write_lines_atomic(path: str | Path, lines: Iterable[str]) -> int:
    """Write ready JSONL lines (no newlines) to `path` via a temporary file + `os.replace`."""
    count = 0
    with atomic_open(path) as f:
        for line in lines:
            f.write(line + "\n")
            count += 1
    return count


def scan_and_repair(path: Path) -> tuple[list[str], int]:
    """Ids of a shard's complete records, truncating a torn or unreadable last line.

    Returns (ids, bytes truncated)."""
    ids: list[str] = []
    good_end = 0
    bad_line: int | None = None
    with path.open("rb") as f:
        for lineno, line in enumerate(f, start=1):
            if bad_line is not None:
                raise CorruptShardError(
                    f"{path}: line {bad_line} is not a complete JSON record but more lines follow; "
                    f"this is not a torn write — move the file aside and rerun to regenerate its records"
                )
            try:
                record = json.loads(line) if line.endswith(b"\n") else None
            except (json.JSONDecodeError, UnicodeDecodeError):
                record = None
            if record is None:
                if line.strip():
                    bad_line = lineno
                else:
                    good_end += len(line) if line.endswith(b"\n") else 0
                continue
            ids.append(record["id"])
            good_end += len(line)
        size = f.seek(0, os.SEEK_END)
    if size > good_end:
        with path.open("r+b") as f:
            f.truncate(good_end)
            f.flush()
            os.fsync(f.fileno())
    return ids, size - good_end


def _write_all(fd: int, data: bytes) -> None:
    """`os.write` until every byte is written (a nearly full disk takes part of a write)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class ShardWriter:
    """Append-only writer over a folder of shards, resuming what is already there.

    `ids` holds every id written (before and during this session); `write` ignores an id already
    present, so each id appears exactly once across the folder. A failed flush (a full disk:
    `DiskFull`) cuts the shard back to its last fsync'ed batch and forgets the unwritten ids, so
    the folder holds whole records only and a resume writes those records again."""

    def __init__(self, folder: str | Path, shard_size: int = 50_000, flush_every: int = 64):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.shard_size = shard_size
        self.flush_every = flush_every
        self.ids: set[str] = set()
        self.resumed = 0
        self.truncated_bytes = 0
        self._index = 0
        self._in_shard = 0
        for i, path in enumerate(shard_paths(self.folder)):
            ids, cut = scan_and_repair(path)
            self.ids.update(ids)
            self.truncated_bytes += cut
            self._index, self._in_shard = i, len(ids)
        self.resumed = len(self.ids)
        self._buffer: list[tuple[str, str]] = []  # (id, line) not yet written
        self._fd: int | None = None

    def write(self, record: dict[str, Any]) -> bool:
        """Buffer one record (flushed every `flush_every`); False if its id was already written."""
        if record["id"] in self.ids:
            return False
        self.ids.add(record["id"])
        self._buffer.append((record["id"], dumps(record) + "\n"))
        if len(self._buffer) >= self.flush_every:
            self.flush()
        return True

    def flush(self) -> None:
        """Append the buffered records, rolling to a new shard at `shard_size`, then fsync."""
        if not self._buffer:
            return
        batch, self._buffer = self._buffer, []
        done, start = 0, None  # records of `batch` fsync'ed; the shard's size before the write under way

        def undo() -> None:  # back to the last fsync'ed batch; the unwritten ids are written again later
            self.ids.difference_update(i for i, _ in batch[done:])
            if self._fd is not None and start is not None:
                os.ftruncate(self._fd, start)
                os.fsync(self._fd)
            self._close_file()

        with stop_when_full(self.folder, f"a batch of {len(batch)} records", cleanup=undo,
                            needed=lambda: sum(len(line.encode()) for _, line in batch[done:]),
                            basis="the records being written; more to finish"):
            while done < len(batch):
                if self._in_shard >= self.shard_size:
                    self._close_file()
                    self._index, self._in_shard = self._index + 1, 0
                if self._fd is None:
                    self._fd = os.open(shard_path(self.folder, self._index), os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                                       0o666)
                start = os.lseek(self._fd, 0, os.SEEK_END)
                chunk = batch[done : done + self.shard_size - self._in_shard]
                _write_all(self._fd, "".join(line for _, line in chunk).encode("utf-8"))
                os.fsync(self._fd)
                self._in_shard, done, start = self._in_shard + len(chunk), done + len(chunk), None

    def _close_file(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        self.flush()
        self._close_file()

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
