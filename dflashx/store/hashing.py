"""Streaming sha256 of files and folders, and a cheap fingerprint of large inputs.

A folder's sha256 is stable across machines: it hashes the sorted list of
`"<relative posix path>\\0<file sha256>\\n"` lines of every regular file under it (empty folders and
file times do not count), so the same content copied elsewhere hashes the same.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

CHUNK = 1 << 20


@dataclass(frozen=True)
class FileDigest:
    size: int
    sha256: str


@dataclass(frozen=True)
class PathDigest:
    """Digest of a file or a folder; `files` (relative posix path -> digest) only for folders."""

    kind: Literal["file", "dir"]
    size: int
    sha256: str
    files: dict[str, FileDigest] | None = None


def sha256_file(path: str | os.PathLike[str]) -> str:
    """sha256 hex digest of a file, read in chunks (never whole into memory)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def iter_files(folder: Path) -> list[str]:
    """Relative posix paths of the regular files under `folder`, sorted."""
    found = []
    for root, _dirs, names in os.walk(folder):
        for name in names:
            full = Path(root, name)
            if full.is_file():
                found.append(full.relative_to(folder).as_posix())
    return sorted(found)


def folder_sha256(files: dict[str, FileDigest]) -> str:
    """The folder hash over its files' relative paths and sha256s (see module docstring)."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(f"{rel}\0{files[rel].sha256}\n".encode())
    return h.hexdigest()


def digest_path(path: str | os.PathLike[str], *, content: bool = True) -> PathDigest:
    """Size and sha256 of a file or folder. `content=False` only sums sizes (sha256 = "")."""
    path = Path(path)
    if path.is_file():
        size = path.stat().st_size
        return PathDigest("file", size, sha256_file(path) if content else "")
    if not path.is_dir():
        raise FileNotFoundError(f"no file or folder at {path}")
    files = {}
    for rel in iter_files(path):
        full = path / rel
        files[rel] = FileDigest(full.stat().st_size, sha256_file(full) if content else "")
    size = sum(d.size for d in files.values())
    return PathDigest("dir", size, folder_sha256(files) if content else "", files if content else None)


def fingerprint(path: str | os.PathLike[str], *, small: int = 256 << 20, edge: int = 16 << 20) -> str:
    """A location-independent identity of an input file or folder, cheap even for model weights.

    Files up to `small` bytes hash fully; larger files hash their size plus first and last `edge`
    bytes. Folders hash each file's relative path with that file's fingerprint. Moving or copying
    the data keeps the fingerprint; editing it changes it (except edits in the unread middle of a
    big file, which is the price of not reading 50 GB of weights on every `dflashx run`).
    """
    path = Path(path)
    if path.is_dir():
        h = hashlib.sha256()
        for rel in iter_files(path):
            h.update(f"{rel}\0{fingerprint(path / rel, small=small, edge=edge)}\n".encode())
        return h.hexdigest()
    size = path.stat().st_size
    if size <= small:
        return sha256_file(path)
    h = hashlib.sha256(f"size={size}\n".encode())
    with open(path, "rb") as f:
        h.update(f.read(edge))
        f.seek(size - edge)
        h.update(f.read(edge))
    return h.hexdigest()
