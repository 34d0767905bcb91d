"""A full disk is a stop, not a corruption: recognise a write that failed for lack of space.

Writers put their writes inside `stop_when_full(folder, what, needed=..., cleanup=...)`. When the
block fails, `cleanup` removes the partial write (the last complete record or checkpoint stays),
and a failure for lack of space becomes `DiskFull`, whose message names the folder, the space free
there now and roughly the space needed, and says that running the same command again resumes.
Stages turn it into `StageFailed`.

Lack of space is an `OSError` with errno ENOSPC or EDQUOT anywhere in the exception's chain, or
its text in a library's own error (safetensors: "No space left on device (os error 28)"). Some
writers lose the errno altogether (`torch.save` on a full disk raises `RuntimeError: unexpected
pos ...`), so any failure while the folder's file system has less than `LOW_SPACE_BYTES` free
counts as a full disk too; the writer's own words are quoted in the message.
"""

from __future__ import annotations

import errno
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dflashx.store.hashing import digest_path

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_DISK_FULL_TEXT = re.compile(
    rf"no space left on device|disk quota exceeded|not enough disk space|"
    rf"os error (?:{errno.ENOSPC}|{errno.EDQUOT})\b|errno (?:{errno.ENOSPC}|{errno.EDQUOT})\b",
    re.IGNORECASE,
)
LOW_SPACE_BYTES = 1 << 20  # less than this free when a write fails: the disk is full
RESUME_HINT = "free space and run the same command again: it resumes"


def free_bytes(path: str | Path) -> int:
    """Bytes free to this user on the file system holding `path` (or its nearest existing parent)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def used_bytes(path: str | Path) -> int:
    """Size of a file, or of every file under a folder; 0 when there is nothing there."""
    return digest_path(path, content=False).size if Path(path).exists() else 0


def size_text(n: float) -> str:
    """Bytes as KiB below 1 MiB, MiB below 1 GiB, else GiB (one decimal)."""
    unit = 3 if n >= 2**30 else 2 if n >= 2**20 else 1
    return f"{n / 2 ** (10 * unit):.1f} {('KiB', 'MiB', 'GiB')[unit - 1]}"


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_disk_full(exc: BaseException, folder: str | Path | None = None) -> bool:
    """Did `exc` come from a full disk (or an exhausted quota)? With `folder`, a failure while
    its file system has less than LOW_SPACE_BYTES free counts as one too (see module docstring)."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            return True
        if _DISK_FULL_TEXT.search(str(e)):
            return True
    return folder is not None and free_bytes(folder) < LOW_SPACE_BYTES


class DiskFull(RuntimeError):
    """A write into `folder` failed for lack of space; what was completely written before stays."""

    def __init__(self, folder: str | Path, what: str, needed: float | None = None, basis: str = "",
                 cause: str = "", free: int | None = None):
        self.folder, self.what, self.needed, self.basis, self.cause = Path(folder), what, needed, basis, cause
        self.free = free_bytes(folder) if free is None else free
        super().__init__(self._message())

    def _message(self) -> str:
        cause = f" ({self.cause})" if self.cause else ""
        if self.needed:
            need = f"about {size_text(self.needed)} needed" + (f" ({self.basis})" if self.basis else "")
        else:
            need = "the space needed is not known"
        return (f"disk full: writing {self.what} into {self.folder} failed{cause}; {size_text(self.free)} free "
                f"there now, {need}. What was completely written before is intact: {RESUME_HINT}.")

    def restated(self, needed: float | None, basis: str) -> "DiskFull":
        """The same stop with a better estimate of the space needed (e.g. the plan's for the stage)."""
        return DiskFull(self.folder, self.what, needed, basis, self.cause, self.free)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


@contextmanager
def stop_when_full(folder: str | Path, what: str, needed: float | Callable[[], float] | None = None,
                   basis: str = "", cleanup: Callable[[], None] | None = None) -> Iterator[None]:
    """Run a write; on any failure run `cleanup` (remove the partial write), and when the failure
    is a full disk raise `DiskFull` (from the original error) instead. `needed` may be a callable,
    evaluated before `cleanup` (e.g. the size of the partial write)."""
    try:
        yield
    except Exception as exc:
        full = isinstance(exc, DiskFull) or is_disk_full(exc, folder)  # measured before cleanup frees space
        need = needed() if callable(needed) else needed
        if cleanup is not None:
            cleanup()
        if not full or isinstance(exc, DiskFull):
            raise
        raise DiskFull(folder, what, need, basis, _first_line(exc)) from exc
