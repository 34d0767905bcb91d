"""Process-level output: the terminal the run's view draws on, and a stage's output captured into
its `stage.log`.

`terminal()` (the CLI opens it once, before any stage runs) yields the stream the terminal view
writes to: a duplicate of file descriptor 1 when `sys.stdout` is the process's real fd 1, else
`sys.stdout` as it is then (under click's CliRunner, a notebook, pytest's capture).

`captured(path)` sends, while its block runs, everything a stage and the libraries it calls write
to `path` (appended), so the terminal shows only the view:
- the `dflashx` loggers' INFO+ lines, formatted and redacted (as before: the stage log proper);
- the third-party loggers in `NOISY_LOGGERS` (DeepSpeed's accelerator and scheduler lines,
  transformers' weight loading, datasets, torch) and `warnings.warn` (as `py.warnings`), redacted;
- `print()`, tqdm bars and anything else written to `sys.stdout`/`sys.stderr`, line by line,
  redacted;
- when `sys.stdout`/`sys.stderr` are the real fds 1 and 2: the fds themselves (`os.dup2`), so
  C-level output (gloo, NCCL, tokenizers) and child processes land in the file too (not redacted:
  it never passes through Python).
Everything is restored on exit, also after an exception or Ctrl-C.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, TextIO

from dflashx.track.redact import RedactingFilter, redact_text

# Third-party loggers that bring their own handler on a stream they grabbed at import (so they would
# bypass the redirection); loggers without handlers reach logging's last resort on sys.stderr, which
# is captured. Not W&B: its logger writes its own debug.log.
NOISY_LOGGERS = ("DeepSpeed", "transformers", "datasets", "huggingface_hub", "torch", "accelerate", "py.warnings")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _is_fd(stream: Any, fd: int) -> bool:
    try:
        return stream.fileno() == fd
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return False


def real_fds() -> bool:
    """Whether `sys.stdout` and `sys.stderr` write to the process's fds 1 and 2."""
    return _is_fd(sys.stdout, 1) and _is_fd(sys.stderr, 2)


@contextmanager
def terminal() -> Iterator[TextIO]:
    """The stream the run's view writes to, unaffected by `captured` (see the module docstring)."""
    if not _is_fd(sys.stdout, 1):
        yield sys.stdout
        return
    sys.stdout.flush()
    stream = os.fdopen(os.dup(1), "w", buffering=1, encoding=sys.stdout.encoding or "utf-8", errors="replace")
    try:
        yield stream
    finally:
        stream.close()


class _LineRedactor(io.TextIOBase):
    """A text stream that appends complete lines, redacted, to a file. After `close` (a library may
    keep a reference to it past the stage) it writes to the stream it replaced."""

    def __init__(self, file: TextIO, replaced: TextIO):
        self.file, self.replaced, self.pending = file, replaced, ""
        self.lock = threading.Lock()  # tqdm's monitor and other threads print too

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    @property
    def buffer(self) -> Any:  # some libraries write bytes; those bypass the redaction
        return self.file.buffer if not self.file.closed else self.replaced.buffer

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:  # subprocess.run(stdout=sys.stdout) then writes to the log as well
        return self.file.fileno() if not self.file.closed else self.replaced.fileno()

    def write(self, text: str) -> int:
        with self.lock:
            if self.file.closed:
                return self.replaced.write(text)
            *lines, self.pending = (self.pending + text).split("\n")
            if lines:
                self.file.write("".join(redact_text(line) + "\n" for line in lines))
                self.file.flush()
            return len(text)

    def flush(self) -> None:
        if not self.file.closed:
            self.file.flush()

    def close(self) -> None:
        with self.lock:
            if not self.file.closed:
                if self.pending:
                    self.file.write(redact_text(self.pending) + "\n")
                    self.pending = ""
                self.file.close()


@contextmanager
def _fds_to(path: Path) -> Iterator[None]:
    """Point fds 1 and 2 at `path` (appending) when they are sys.stdout's and sys.stderr's."""
    if not real_fds():
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):
                pass
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)


@contextmanager
def _streams_to(path: Path) -> Iterator[None]:
    """Replace sys.stdout and sys.stderr by redacting writers into `path`."""
    previous = sys.stdout, sys.stderr
    writers = [_LineRedactor(open(path, "a", encoding="utf-8", errors="replace"), stream)  # noqa: SIM115
               for stream in previous]
    sys.stdout, sys.stderr = writers
    try:
        yield
    finally:
        sys.stdout, sys.stderr = previous
        for writer in writers:
            writer.close()


def _warning_to_log(message: Any, category: type[Warning], filename: str, lineno: int,
                    file: Any = None, line: str | None = None) -> None:
    text = warnings.formatwarning(message, category, filename, lineno, line).rstrip()
    logging.getLogger("py.warnings").warning("%s", text)


@contextmanager
def _logs_to(path: Path) -> Iterator[None]:
    """The `dflashx` loggers (INFO+), the noisy third-party loggers and warnings into `path`."""
    handler = logging.FileHandler(path, encoding="utf-8", delay=True)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(RedactingFilter())
    ours = logging.getLogger("dflashx")
    level = ours.level
    if ours.getEffectiveLevel() > logging.INFO:
        ours.setLevel(logging.INFO)
    ours.addHandler(handler)
    noisy = [logging.getLogger(name) for name in NOISY_LOGGERS]
    saved = [(logger.handlers, logger.propagate) for logger in noisy]
    for logger in noisy:
        logger.handlers, logger.propagate = [handler], False
    shown, warnings.showwarning = warnings.showwarning, _warning_to_log  # not catch_warnings: filters stay
    try:
        yield
    finally:
        warnings.showwarning = shown
        for logger, (handlers, propagate) in zip(noisy, saved):
            added = [h for h in logger.handlers if h is not handler and h not in handlers]  # e.g. at import
            logger.handlers, logger.propagate = [*handlers, *added], propagate
        ours.removeHandler(handler)
        ours.setLevel(level)
        handler.close()


@contextmanager
def captured(path: str | os.PathLike[str]) -> Iterator[None]:
    """Everything the process writes while the block runs goes to `path` (see the module docstring)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        stack.enter_context(_fds_to(path))  # first: it asks whether sys.stdout is still fd 1
        stack.enter_context(_streams_to(path))
        stack.enter_context(_logs_to(path))
        yield
