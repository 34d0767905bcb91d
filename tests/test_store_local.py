"""Local folder backend and the transfer helpers that need no server."""

from __future__ import annotations

from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from dflashx.store.base import ChecksumMismatch, StoreError
from dflashx.store.hashing import sha256_file
from dflashx.store.local import LocalStore
from dflashx.store.transfer import MIN_PART, choose_part_size, with_retries


def test_put_get_list_delete_round_trip(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "remote")
    src = tmp_path / "a.txt"
    src.write_text("hello\n")
    info = store.put(src, "run/a.txt")
    assert info.sha256 == sha256_file(src) == store.stat("run/a.txt").sha256
    assert [i.key for i in store.list("run/")] == ["run/a.txt"]  # the sha256 sidecars are not listed
    store.get("run/a.txt", tmp_path / "back/a.txt")
    assert (tmp_path / "back/a.txt").read_text() == "hello\n"
    store.delete("run/a.txt")
    assert store.stat("run/a.txt") is None and list(store.list()) == []


def test_keys_cannot_escape_the_root(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "remote")
    for key in ("../outside", ".sha256/x", ""):
        with pytest.raises(StoreError, match="escapes the store root"):
            store.stat(key)


def test_verify_reads_the_bytes(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "remote")
    src = tmp_path / "a.txt"
    src.write_text("hello\n")
    sha = store.put(src, "a.txt").sha256
    (tmp_path / "remote/a.txt").write_text("jello\n")
    with pytest.raises(ChecksumMismatch, match="hashes to"):
        store.verify("a.txt", sha)
    with pytest.raises(ChecksumMismatch, match="records sha256"):
        store.verify("a.txt", "0" * 64)


def test_part_size_respects_s3_limits() -> None:
    assert choose_part_size(10, 1) == MIN_PART
    assert choose_part_size(100 * 2**20, 64 * 2**20) == 64 * 2**20
    huge = 2 * 2**40  # 2 TiB: 64 MiB parts would need 32,768 parts
    size = choose_part_size(huge, 64 * 2**20)
    assert size % 2**20 == 0 and huge / size <= 10_000


def _error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}}, "UploadPart")


def test_retries_transient_errors_and_stops_on_fatal() -> None:
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise _error("SlowDown")
        return "done"

    assert with_retries(flaky, "part", attempts=5, base_delay=0) == "done" and len(calls) == 3
    calls.clear()
    with pytest.raises(ClientError):
        with_retries(lambda: calls.append(1) or (_ for _ in ()).throw(_error("InvalidAccessKeyId")),
                     "part", attempts=5, base_delay=0, fatal=lambda e: True)
    assert len(calls) == 1
