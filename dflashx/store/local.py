"""Local filesystem backend: a folder (another disk, an NFS mount) that mirrors the S3 layout.

Object `key` is the file `<root>/<key>`; its sha256 is kept in `<root>/.sha256/<key>` so `stat`
never has to read the object. Object and sidecar are written atomically (`dflashx.store.atomic`).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

from dflashx.store.atomic import atomic_copy, atomic_write_text
from dflashx.store.base import ObjectInfo, Progress, Store, StoreError, file_chunks

_META = ".sha256"


class LocalStore(Store):
    def __init__(self, root: Path | str):
        self.root = Path(root).expanduser().resolve()

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root not in path.parents or key.startswith(_META):
            raise StoreError(f"key {key!r} escapes the store root {self.root}")
        return path

    def _meta(self, key: str) -> Path:
        return self.root / _META / key

    def uri(self, key: str) -> str:
        return str(self.root / key)

    def stat(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        if not path.is_file():
            return None
        meta = self._meta(key)
        sha = meta.read_text().strip() if meta.is_file() else None
        return ObjectInfo(key=key, size=path.stat().st_size, sha256=sha)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        if not self.root.is_dir():
            return
        for path in sorted(self.root.rglob("*")):
            key = path.relative_to(self.root).as_posix()
            if path.is_file() and key.startswith(prefix) and not key.startswith(_META + "/"):
                info = self.stat(key)
                if info is not None:
                    yield info

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)
        self._meta(key).unlink(missing_ok=True)

    def read_chunks(self, key: str) -> Iterator[bytes]:
        return file_chunks(self._path(key))

    def _upload(self, src: Path, key: str, sha256: str, progress: Progress | None) -> None:
        dest = self._path(key)
        atomic_copy(src, dest)
        atomic_write_text(self._meta(key), sha256 + "\n")
        if progress is not None:
            progress(dest.stat().st_size)

    def _download(self, key: str, dest: Path) -> None:
        shutil.copyfile(self._path(key), dest)  # `get` gives a temporary file and renames it
