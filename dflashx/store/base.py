"""The artifact store interface shared by the local and S3 backends.

A store holds objects under string keys ("<run>/<stage>/<file>", always "/"-separated) and keeps
each object's sha256 next to it (S3 object metadata, or a sidecar file for the local backend).
Every transfer is checked: `put` verifies the stored copy against the local file's sha256 and
`get` verifies the downloaded file before it replaces the destination (see `verify`).
`dflashx.store.stores.open_store` picks the backend of a run.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dflashx.store.atomic import atomic_path
from dflashx.store.hashing import sha256_file

CHUNK = 8 * 2**20  # bytes read per step when hashing

Progress = Callable[[int], None]  # called with the number of bytes just transferred


class StoreError(RuntimeError):
    """A store operation failed; the message says what to do."""


class StoreAuthError(StoreError):
    """The remote rejected the credentials (wrong key, wrong secret, no credentials at all)."""


class ChecksumMismatch(StoreError):
    """A stored or transferred object does not hash to the sha256 it should have."""


@dataclass(frozen=True)
class ObjectInfo:
    """What a store knows about one object without reading it."""

    key: str
    size: int
    sha256: str | None  # from metadata; None when the object was written without it


def sha256_chunks(chunks: Iterable[bytes]) -> str:
    """Hex sha256 of a stream of byte chunks (a download body, a file read in pieces)."""
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


def file_chunks(path: Path, start: int = 0, length: int | None = None) -> Iterator[bytes]:
    """Read `length` bytes of `path` from `start` (to the end when None) in CHUNK pieces."""
    remaining = length
    with open(path, "rb") as f:
        f.seek(start)
        while remaining is None or remaining > 0:
            chunk = f.read(CHUNK if remaining is None else min(CHUNK, remaining))
            if not chunk:
                break
            if remaining is not None:
                remaining -= len(chunk)
            yield chunk


class Store(ABC):
    """put/get/exists/stat/list/delete with sha256, for one backend."""

    @abstractmethod
    def uri(self, key: str) -> str:
        """Where `key` lives, as a user would type it (s3://bucket/prefix/key, /abs/path/key)."""

    @abstractmethod
    def stat(self, key: str) -> ObjectInfo | None:
        """Size and recorded sha256 of `key`, or None when it does not exist."""

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix`."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove `key` (no error when it is already gone)."""

    @abstractmethod
    def read_chunks(self, key: str) -> Iterator[bytes]:
        """The stored bytes of `key`, streamed."""

    @abstractmethod
    def _upload(self, src: Path, key: str, sha256: str, progress: Progress | None) -> None:
        """Copy `src` to `key`, recording `sha256` with it (no verification here)."""

    @abstractmethod
    def _download(self, key: str, dest: Path) -> None:
        """Copy `key` to the local file `dest` (no verification here)."""

    def check_access(self) -> None:  # noqa: B027 - a hook: a store that can check early overrides it
        """Raise StoreAuthError/StoreError early when the store cannot be used."""

    def exists(self, key: str) -> bool:
        return self.stat(key) is not None

    def remote_sha256(self, key: str) -> str:
        """Hash the stored bytes of `key` by reading them back in full.

        This is the check `verify` relies on: it costs one download of the object, and in return
        it catches anything the server holds that differs from what was sent (a truncated upload,
        a corrupted or overwritten object) whatever the server's own ETag or checksum rules are.
        """
        return sha256_chunks(self.read_chunks(key))

    def verify(self, key: str, sha256: str) -> None:
        """Raise ChecksumMismatch unless `key` exists and both its metadata and bytes give `sha256`."""
        info = self.stat(key)
        if info is None:
            raise ChecksumMismatch(f"{self.uri(key)} is missing")
        if info.sha256 != sha256:
            raise ChecksumMismatch(
                f"{self.uri(key)} records sha256 {info.sha256}, expected {sha256}"
            )
        actual = self.remote_sha256(key)
        if actual != sha256:
            raise ChecksumMismatch(f"{self.uri(key)} hashes to {actual}, expected {sha256}")

    def put(self, src: Path, key: str, sha256: str | None = None,
            progress: Progress | None = None) -> ObjectInfo:
        """Upload `src` to `key` and verify the stored copy; returns its ObjectInfo."""
        sha256 = sha256 or sha256_file(src)
        self._upload(src, key, sha256, progress)
        self.verify(key, sha256)
        return ObjectInfo(key=key, size=src.stat().st_size, sha256=sha256)

    def get(self, key: str, dest: Path) -> ObjectInfo:
        """Download `key` to `dest` atomically, checking the bytes against the recorded sha256."""
        info = self.stat(key)
        if info is None:
            raise StoreError(f"{self.uri(key)} does not exist")
        with atomic_path(dest) as tmp:  # a mismatch raises: the temporary file goes, dest stays
            self._download(key, tmp)
            actual = sha256_file(tmp)
            if info.sha256 is not None and actual != info.sha256:
                raise ChecksumMismatch(
                    f"downloaded {self.uri(key)} hashes to {actual}, its metadata says {info.sha256}"
                )
        return info

