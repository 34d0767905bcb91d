"""The full-disk fault for the disk-full tests: `FakeDisk` (ENOSPC injected past a byte budget under a folder,
at `os.write`, fsspec's local `.write` and `torch.save`), `small_fs` (a real tmpfs with `size=`, skipped where
mounting needs root) and the stop-message check."""

from __future__ import annotations

import errno
import io
import os
import shutil
import subprocess
from pathlib import Path

import pytest

RESUME = "run the same command again: it resumes"


class FakeDisk:
    """The disk holding `root` has `room` bytes left (None: plenty); see the module docstring."""

    def __init__(self, monkeypatch, root: Path, room: int | None = None):
        import torch
        from fsspec.implementations.local import LocalFileOpener

        self.root, self.room, self.written = os.path.realpath(root), room, 0
        real_write, real_fs_write, real_save = os.write, LocalFileOpener.write, torch.save

        def write(fd, data):
            if not self._under(f"/proc/self/fd/{fd}"):
                return real_write(fd, data)
            if not (n := self._take(len(data))):
                raise full()
            return real_write(fd, bytes(memoryview(data)[:n]))  # a short write, as on a nearly full disk

        def fs_write(opener, data):
            if not self._under(opener.path):
                return real_fs_write(opener, data)
            view = memoryview(data)
            n = self._take(len(view))
            real_fs_write(opener, view[:n])
            if n < len(view):
                raise full()
            return n

        def save(obj, f, *args, **kwargs):
            if not isinstance(f, (str, os.PathLike)) or not self._under(f):
                return real_save(obj, f, *args, **kwargs)
            real_save(obj, buf := io.BytesIO(), *args, **kwargs)
            Path(f).write_bytes(buf.getvalue()[:(n := self._take(len(buf.getvalue())))])
            if n < len(buf.getvalue()):
                raise full(str(f))

        monkeypatch.setattr(os, "write", write)
        monkeypatch.setattr(LocalFileOpener, "write", fs_write)
        monkeypatch.setattr(torch, "save", save)

    def _under(self, path) -> bool:
        return os.path.realpath(path).startswith(self.root + os.sep)

    def _take(self, n: int) -> int:
        k = n if self.room is None else min(n, self.room)
        self.written, self.room = self.written + k, None if self.room is None else self.room - k
        return k


def full(*where: str) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), *where)


@pytest.fixture
def small_fs(tmp_path):
    """`mount(size) -> folder` on a real tmpfs of that size; `resize(folder, size)` frees space."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        where = tmp_path / f"small{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True) if shutil.which("mount") else None
        if done is None or done.returncode:
            why = done.stderr.strip() if done else "no mount"
            pytest.skip(f"a real small file system needs root mount privileges: {why}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def resize(where: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(where)], check=True)


def assert_stop_message(message: str, folder: Path) -> None:
    assert str(folder) in message and "free there now" in message and "needed" in message and RESUME in message
