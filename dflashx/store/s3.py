"""S3 backend through boto3: any endpoint (AWS, SeaweedFS, MinIO, R2), optional path-style.

Credentials come only from boto3's own chain — the environment (AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY) or a named profile (`storage.s3.aws_profile`) — never from the recipe.
The sha256 of each object is stored as user metadata (`x-amz-meta-sha256`). Objects at least one
part long go through the resumable multipart upload in `dflashx.store.transfer`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from dflashx.config.schema import S3Spec
from dflashx.store.base import CHUNK, ObjectInfo, Progress, Store, StoreAuthError, StoreError
from dflashx.store.transfer import is_fatal, multipart_upload, with_retries

_AUTH_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch"}
_MISSING = {"404", "NoSuchKey", "NotFound"}


class S3Store(Store):
    def __init__(self, spec: S3Spec, state_dir: Path, max_attempts: int = 8):
        self.spec = spec
        self.state_dir = Path(state_dir)
        self.endpoint = spec.endpoint_url or "the default AWS endpoint"
        config = Config(
            s3={"addressing_style": "path" if spec.path_style else "auto"},
            retries={"max_attempts": max_attempts, "mode": "standard"},
            max_pool_connections=max(10, spec.max_concurrency),
            signature_version="s3v4",
        )
        session = boto3.session.Session(profile_name=spec.aws_profile)
        self.client: Any = session.client(
            "s3", endpoint_url=spec.endpoint_url, region_name=spec.region or session.region_name
            or "us-east-1", config=config)
        self.prefix = spec.prefix.strip("/")

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def uri(self, key: str) -> str:
        return f"s3://{self.spec.bucket}/{self._key(key)}"

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Turn boto errors into StoreError messages that say what to check."""
        try:
            yield
        except NoCredentialsError as exc:
            raise StoreAuthError(
                f"no S3 credentials found for endpoint {self.endpoint}: set AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY or storage.s3.aws_profile") from exc
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in _AUTH_CODES:
                raise StoreAuthError(
                    f"S3 rejected the credentials for endpoint {self.endpoint}: check "
                    "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or storage.s3.aws_profile") from exc
            if code == "AccessDenied":
                raise StoreAuthError(
                    f"S3 denied {what} on bucket {self.spec.bucket} at {self.endpoint}: the "
                    "credentials are valid but lack permission (s3:PutObject/GetObject/ListBucket)"
                ) from exc
            if code == "NoSuchBucket":
                raise StoreError(
                    f"bucket {self.spec.bucket!r} does not exist at {self.endpoint}: create it or "
                    "fix storage.s3.bucket") from exc
            raise StoreError(f"S3 {what} failed at {self.endpoint}: {exc}") from exc
        except BotoCoreError as exc:
            raise StoreError(f"S3 {what} failed at {self.endpoint}: {exc}") from exc

    def check_access(self) -> None:
        """Fail early, with the clear message, when credentials or the bucket are wrong."""
        with self._errors("listing"):
            self.client.list_objects_v2(Bucket=self.spec.bucket, Prefix=self._key(""), MaxKeys=1)

    def stat(self, key: str) -> ObjectInfo | None:
        with self._errors(f"reading {key}"):
            try:
                head = self.client.head_object(Bucket=self.spec.bucket, Key=self._key(key))
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code", "") in _MISSING:
                    return None
                raise
        return ObjectInfo(key=key, size=head["ContentLength"], sha256=head["Metadata"].get("sha256"))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Keys and sizes under `prefix` (sha256 None: metadata needs one HEAD per object)."""
        strip = len(self._key(""))
        with self._errors("listing"):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.spec.bucket, Prefix=self._key(prefix))
            for page in pages:
                for obj in page.get("Contents", []):
                    yield ObjectInfo(key=obj["Key"][strip:], size=obj["Size"], sha256=None)

    def delete(self, key: str) -> None:
        with self._errors(f"deleting {key}"):
            self.client.delete_object(Bucket=self.spec.bucket, Key=self._key(key))

    def read_chunks(self, key: str) -> Iterator[bytes]:
        with self._errors(f"reading {key}"):
            body = self.client.get_object(Bucket=self.spec.bucket, Key=self._key(key))["Body"]
            yield from body.iter_chunks(CHUNK)

    def _upload(self, src: Path, key: str, sha256: str, progress: Progress | None) -> None:
        size = src.stat().st_size
        with self._errors(f"uploading {key}"):
            if size >= self.spec.part_size:  # >= 5 MiB by the schema
                multipart_upload(self.client, self.spec.bucket, self._key(key), src, sha256,
                                 self.state_dir, self.spec.part_size, progress,
                                 concurrency=self.spec.max_concurrency)
                return
            body = src.read_bytes()
            with_retries(lambda: self.client.put_object(
                Bucket=self.spec.bucket, Key=self._key(key), Body=body, Metadata={"sha256": sha256}),
                f"uploading {key}", fatal=is_fatal)
            if progress is not None:
                progress(size)

    def _download(self, key: str, dest: Path) -> None:
        with self._errors(f"downloading {key}"):
            self.client.download_file(self.spec.bucket, self._key(key), str(dest))
