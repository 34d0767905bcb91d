"""Multipart upload to S3 that resumes after the process is killed.

boto3's managed transfer retries but forgets an unfinished upload when the process dies, which on
a rented node being shut down means sending hundreds of GB again. Here the UploadId and the ETag of
each finished part go to a small JSON state file (written atomically after every part) under the
run's `.backup/uploads/`. On the next attempt the server's `list_parts` is the authority: parts it
holds with the expected size are kept, the rest are sent. Each part is retried with exponential
back-off on top of botocore's own retry policy (network drops in the middle of a part body are not
always retried by botocore). Parts go up `concurrency` at a time (one thread each, like boto3's
managed transfer); the state file is rewritten under a lock as each one finishes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from dflashx.store.atomic import atomic_write_json
from dflashx.store.base import Progress

log = logging.getLogger(__name__)

MIN_PART = 5 * 2**20  # S3's smallest part (except the last)
MAX_PARTS = 10_000  # S3's part count limit
T = TypeVar("T")


@dataclass
class UploadState:
    """What survives a kill: enough to find the multipart upload again."""

    bucket: str
    key: str
    upload_id: str
    sha256: str
    size: int
    part_size: int
    parts: dict[str, str] = field(default_factory=dict)  # part number -> ETag

    def matches(self, bucket: str, key: str, sha256: str, size: int, part_size: int) -> bool:
        return (self.bucket, self.key, self.sha256, self.size, self.part_size) == (
            bucket, key, sha256, size, part_size)


def choose_part_size(size: int, preferred: int) -> int:
    """`preferred`, raised to S3's minimum and enough to stay under 10,000 parts (MiB multiples)."""
    needed = max(preferred, MIN_PART, math.ceil(size / MAX_PARTS))
    return math.ceil(needed / 2**20) * 2**20


def state_path(state_dir: Path, bucket: str, key: str) -> Path:
    name = hashlib.sha256(f"{bucket}/{key}".encode()).hexdigest()[:32]
    return state_dir / f"{name}.json"


def _save_state(path: Path, state: UploadState) -> None:
    atomic_write_json(path, asdict(state))


def _load_state(path: Path) -> UploadState | None:
    try:
        return UploadState(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def with_retries(fn: Callable[[], T], what: str, attempts: int = 5, base_delay: float = 1.0,
                 fatal: Callable[[Exception], bool] = lambda e: False) -> T:
    """Call `fn`, retrying transient boto errors with exponential back-off (1 s, 2 s, 4 s ...)."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except (ClientError, BotoCoreError, OSError) as exc:
            if attempt == attempts or fatal(exc):
                raise
            delay = base_delay * 2 ** (attempt - 1)
            log.warning("%s failed (%s); retry %d/%d in %.0f s", what, exc, attempt, attempts - 1, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def _client_error_code(exc: Exception) -> str:
    return exc.response.get("Error", {}).get("Code", "") if isinstance(exc, ClientError) else ""


_FATAL_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "NoSuchBucket",
                "NoSuchUpload", "InvalidBucketName"}


def is_fatal(exc: Exception) -> bool:
    """Errors that another attempt cannot fix."""
    return _client_error_code(exc) in _FATAL_CODES


def _server_parts(client: Any, state: UploadState) -> dict[int, dict[str, Any]] | None:
    """Parts the server holds for the upload, or None when the upload is gone."""
    parts: dict[int, dict[str, Any]] = {}
    try:
        for page in client.get_paginator("list_parts").paginate(
                Bucket=state.bucket, Key=state.key, UploadId=state.upload_id):
            for part in page.get("Parts", []):
                parts[part["PartNumber"]] = part
    except ClientError as exc:
        if _client_error_code(exc) in {"NoSuchUpload", "404", "NotFound"}:
            return None
        raise
    return parts


def _resume_or_start(client: Any, bucket: str, key: str, src: Path, sha256: str, size: int,
                     part_size: int, spath: Path) -> UploadState:
    state = _load_state(spath)
    if state is not None and state.matches(bucket, key, sha256, size, part_size):
        held = _server_parts(client, state)
        if held is not None:
            state.parts = {}
            for number, part in held.items():
                start = (number - 1) * part_size
                if part["Size"] == min(part_size, size - start):
                    state.parts[str(number)] = part["ETag"]
            log.info("resuming upload of %s: %d part(s) already on the server", key, len(state.parts))
            _save_state(spath, state)
            return state
    upload = with_retries(
        lambda: client.create_multipart_upload(Bucket=bucket, Key=key, Metadata={"sha256": sha256}),
        f"starting upload of {key}", fatal=is_fatal)
    state = UploadState(bucket, key, upload["UploadId"], sha256, size, part_size)
    _save_state(spath, state)
    return state


def multipart_upload(client: Any, bucket: str, key: str, src: Path, sha256: str, state_dir: Path,
                     part_size: int, progress: Progress | None = None, attempts: int = 5,
                     concurrency: int = 1) -> None:
    """Upload `src` in parts (`concurrency` at a time), resuming an attempt recorded in `state_dir`."""
    size = src.stat().st_size
    part_size = choose_part_size(size, part_size)
    spath = state_path(state_dir, bucket, key)
    state = _resume_or_start(client, bucket, key, src, sha256, size, part_size, spath)
    count = max(1, math.ceil(size / part_size))
    lock = threading.Lock()

    def send(number: int) -> None:
        length = min(part_size, size - (number - 1) * part_size)
        if str(number) not in state.parts:
            with open(src, "rb") as f:
                f.seek((number - 1) * part_size)
                body = f.read(length)
            call = partial(client.upload_part, Bucket=bucket, Key=key, UploadId=state.upload_id,
                           PartNumber=number, Body=body)
            etag = with_retries(call, f"part {number}/{count} of {key}", attempts=attempts,
                                fatal=is_fatal)["ETag"]
            with lock:
                state.parts[str(number)] = etag
                _save_state(spath, state)
        if progress is not None:
            progress(length)

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        list(pool.map(send, range(1, count + 1)))  # list(): re-raise a part's error here
    parts = [{"PartNumber": int(n), "ETag": etag}
             for n, etag in sorted(state.parts.items(), key=lambda item: int(item[0]))]
    with_retries(
        lambda: client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=state.upload_id,
                                                 MultipartUpload={"Parts": parts}),
        f"completing upload of {key}", attempts=attempts, fatal=is_fatal)
    spath.unlink(missing_ok=True)
