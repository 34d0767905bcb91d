"""Atomic writes: write a temporary sibling, fsync it, then `os.replace` it into place.

A reader (or a resumed run) never sees half a file: after a kill the old file, or none, is there.
Temporary files are hidden siblings ending in `.tmp` (`.<name>.<random>.tmp`), created with the
permissions of any new file (the umask's), not `tempfile`'s owner-only ones. `atomic_dir` and
`replace_dir` do the same for a folder: it is filled under another name, then renamed into place.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

_ATTEMPTS = 100


def _new_file_beside(path: Path) -> Path:
    """Create an empty, uniquely named hidden sibling of `path` (mode from the umask)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(_ATTEMPTS):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"no free temporary name next to {path}")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path next to `path` for a writer that wants a file name (matplotlib: pass
    `format=`, the name ends in `.tmp`; safetensors; a download); fsynced and renamed into place
    when the block ends without an exception, deleted otherwise."""
    path = Path(path)
    tmp = _new_file_beside(path)
    try:
        yield tmp
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO]:
    """Open a temporary sibling of `path` for writing; fsync and rename it into place on success."""
    encoding = None if "b" in mode else "utf-8"
    with atomic_path(path) as tmp, open(tmp, mode, encoding=encoding) as f:
        yield f


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write a whole text file (UTF-8) atomically."""
    with atomic_open(path) as f:
        f.write(text)


def atomic_write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Write `data` as indented JSON (non-JSON values through `str`) atomically."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def atomic_copy(src: str | os.PathLike[str], dest: str | os.PathLike[str]) -> None:
    """Copy the file `src` to `dest` atomically."""
    with atomic_path(dest) as tmp:
        shutil.copyfile(src, tmp)


def _scratch_dir(path: Path, tag: str) -> Path:
    """The fixed hidden sibling folder `.<name>.<tag>.tmp` of `path`, emptied of a killed attempt."""
    scratch = path.with_name(f".{path.name}.{tag}.tmp")
    shutil.rmtree(scratch, ignore_errors=True)
    return scratch


def replace_dir(src: str | os.PathLike[str], dest: str | os.PathLike[str]) -> None:
    """Put the folder `src` at `dest` (same file system), replacing a folder there.

    The old folder is renamed aside (`.<name>.old.tmp`) and deleted once the new one is in place,
    so a kill never leaves a half-deleted `dest`; only between the two renames is there no `dest`.
    When the second rename fails (a full disk can refuse a directory entry), the old one goes back."""
    src, dest = Path(src), Path(dest)
    old = None
    if dest.exists():
        old = _scratch_dir(dest, "old")
        os.replace(dest, old)
    try:
        os.replace(src, dest)
    except BaseException:
        if old is not None:
            os.replace(old, dest)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def settled_dir(path: str | os.PathLike[str]) -> Path:
    """`path`, put back from `.<name>.old.tmp` when a kill between `replace_dir`'s two renames left only that."""
    path = Path(path)
    old = path.with_name(f".{path.name}.old.tmp")
    if not path.exists() and old.is_dir():
        os.replace(old, path)
    return path


@contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A new empty folder `.<name>.new.tmp` next to `path` to fill; put in place of `path`
    (`replace_dir`) when the block ends without an exception, deleted otherwise. One writer per
    folder: a second `atomic_dir` of the same path starts by deleting the first one's folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _scratch_dir(path, "new")
    tmp.mkdir()
    try:
        yield tmp
        replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
