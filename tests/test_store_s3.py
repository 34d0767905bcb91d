"""S3 backend against a real S3 server (SeaweedFS on loopback) through boto3, path-style."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from s3_fixtures import PART, S3Server

from dflashx.config.schema import S3Spec
from dflashx.store.base import ChecksumMismatch, StoreAuthError, StoreError
from dflashx.store.hashing import sha256_file
from dflashx.store.s3 import S3Store
from dflashx.store.transfer import state_path

pytestmark = pytest.mark.s3


def _file(path: Path, size: int, seed: int = 0) -> Path:
    block = bytes((i * 7 + seed) % 251 for i in range(1 << 16))
    with open(path, "wb") as f:
        f.writelines(block[: min(len(block), size - offset)] for offset in range(0, size, len(block)))
    return path


def _count_calls(store: S3Store, operation: str) -> list[str]:
    """Record every `operation` request the store's client sends (a real botocore event hook)."""
    seen: list[str] = []
    store.client.meta.events.register(f"before-call.s3.{operation}", lambda **kw: seen.append(operation))
    return seen


def test_put_get_stat_list_delete_path_style(s3_spec: S3Spec, tmp_path: Path) -> None:
    store = S3Store(s3_spec, tmp_path / "state")
    urls: list[str] = []
    store.client.meta.events.register("before-send.s3", lambda request, **kw: urls.append(request.url))
    src = _file(tmp_path / "a.bin", 1000)
    info = store.put(src, "run1/stage/a.bin")
    assert info.sha256 == sha256_file(src)
    assert store.stat("run1/stage/a.bin").sha256 == info.sha256
    assert store.uri("run1/stage/a.bin") == f"s3://{s3_spec.bucket}/runs/run1/stage/a.bin"
    assert all(u.startswith(f"{s3_spec.endpoint_url}/{s3_spec.bucket}/") for u in urls)  # path-style
    assert [(i.key, i.size) for i in store.list("run1/")] == [("run1/stage/a.bin", 1000)]
    store.get("run1/stage/a.bin", tmp_path / "back" / "a.bin")
    assert (tmp_path / "back" / "a.bin").read_bytes() == src.read_bytes()
    store.delete("run1/stage/a.bin")
    assert store.stat("run1/stage/a.bin") is None and not store.exists("run1/stage/a.bin")
    assert list(store.list("run1/")) == []


def test_multipart_upload_verifies_and_keeps_sha_in_metadata(s3_spec: S3Spec, tmp_path: Path,
                                                             s3_env: S3Server) -> None:
    store = S3Store(s3_spec.model_copy(update={"max_concurrency": 3}), tmp_path / "state")
    parts = _count_calls(store, "UploadPart")
    src = _file(tmp_path / "big.bin", 2 * PART + 123)
    store.put(src, "big.bin")
    assert len(parts) == 3
    head = s3_env.client().head_object(Bucket=s3_spec.bucket, Key="runs/big.bin")
    assert head["Metadata"]["sha256"] == sha256_file(src)
    assert head["ETag"].endswith('-3"')  # a real multipart object
    assert not any((tmp_path / "state").glob("*.json"))  # state file removed once complete


_UPLOADER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from dflashx.config.schema import S3Spec
    from dflashx.store.s3 import S3Store
    spec, state, src = S3Spec.model_validate(json.loads(sys.argv[1])), Path(sys.argv[2]), Path(sys.argv[3])
    done = []
    def progress(n):  # called by the part threads after each finished part
        done.append(n)
        if len(done) == 3:
            print("PART 3", flush=True)
        if len(done) >= 3:
            time.sleep(120)  # every thread stops here: killed in the middle of the upload
    S3Store(spec, state).put(src, "big.bin", progress=progress)
""")


def test_upload_resumes_after_kill_without_resending_parts(s3_spec: S3Spec, tmp_path: Path,
                                                           s3_env: S3Server) -> None:
    src = _file(tmp_path / "big.bin", 40 * 2**20, seed=3)  # 8 parts of 5 MiB
    state = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-c", _UPLOADER, s3_spec.model_dump_json(), str(state), str(src)],
                            stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.strip() == "PART 3":
                break
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    saved = json.loads(state_path(state, s3_spec.bucket, "runs/big.bin").read_text())
    assert len(saved["parts"]) >= 3
    assert S3Store(s3_spec, state).stat("big.bin") is None  # not complete

    store = S3Store(s3_spec, state)
    held: list[int] = []  # what the server said it holds when the upload resumed
    store.client.meta.events.register(
        "after-call.s3.ListParts", lambda parsed, **kw: held.extend(p["PartNumber"] for p in parsed["Parts"]))
    sent = _count_calls(store, "UploadPart")
    created = _count_calls(store, "CreateMultipartUpload")
    store.put(src, "big.bin")
    assert {int(n) for n in saved["parts"]} <= set(held) and len(held) < 8
    assert len(sent) == 8 - len(held) and created == []  # the missing parts only, same upload
    store.get("big.bin", tmp_path / "back.bin")
    assert sha256_file(tmp_path / "back.bin") == sha256_file(src)


def test_stale_upload_state_starts_a_new_upload(s3_spec: S3Spec, tmp_path: Path) -> None:
    state = tmp_path / "state"
    spath = state_path(state, s3_spec.bucket, "runs/big.bin")
    src = _file(tmp_path / "big.bin", 2 * PART)
    spath.parent.mkdir(parents=True)
    spath.write_text(json.dumps({"bucket": s3_spec.bucket, "key": "runs/big.bin", "upload_id": "gone",
                                 "sha256": sha256_file(src), "size": 2 * PART, "part_size": PART,
                                 "parts": {"1": '"x"'}}))
    store = S3Store(s3_spec, state)
    sent = _count_calls(store, "UploadPart")
    store.put(src, "big.bin")
    assert len(sent) == 2


def test_corrupted_remote_object_is_caught(s3_spec: S3Spec, tmp_path: Path, s3_env: S3Server) -> None:
    store = S3Store(s3_spec, tmp_path / "state")
    src = _file(tmp_path / "a.bin", 4096)
    sha = store.put(src, "a.bin").sha256
    # Same size and metadata, different bytes: only reading the object back can tell.
    s3_env.client().put_object(Bucket=s3_spec.bucket, Key="runs/a.bin", Body=b"\0" * 4096,
                               Metadata={"sha256": sha})
    with pytest.raises(ChecksumMismatch, match="hashes to"):
        store.verify("a.bin", sha)
    with pytest.raises(ChecksumMismatch):
        store.get("a.bin", tmp_path / "out.bin")
    assert not (tmp_path / "out.bin").exists()


@pytest.mark.parametrize("key_id_ok", [True, False], ids=["wrong-secret", "unknown-key-id"])
def test_wrong_credentials_get_a_clear_message(s3_spec: S3Spec, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch, key_id_ok: bool) -> None:
    if not key_id_ok:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANOTAREALKEY00000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    store = S3Store(s3_spec, tmp_path / "state")
    with pytest.raises(StoreAuthError) as err:
        store.check_access()
    assert str(err.value) == (
        f"S3 rejected the credentials for endpoint {s3_spec.endpoint_url}: check "
        "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or storage.s3.aws_profile")
    assert "not-the-secret" not in str(err.value)


def test_missing_credentials_and_bucket(s3_spec: S3Spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(StoreAuthError, match="no S3 credentials found"):
        S3Store(s3_spec, tmp_path).check_access()


def test_missing_bucket_says_so(s3_spec: S3Spec, tmp_path: Path) -> None:
    spec = s3_spec.model_copy(update={"bucket": "no-such-bucket-here"})
    with pytest.raises(StoreError, match="bucket 'no-such-bucket-here' does not exist"):
        S3Store(spec, tmp_path).check_access()
