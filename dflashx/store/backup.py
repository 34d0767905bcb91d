"""Verified backup of a run: copy what is worth keeping, prove every copy by its sha256.

For each file of each irreplaceable (and, by default, replaceable) artifact, then the run's own
files (`inventory.unregistered_files`):
1. the remote object's size and metadata sha256 are compared with the manifest; a missing or
   different object is uploaded from the local copy, but only after the local file is re-hashed
   and found equal to the manifest (a file changed on disk since it was registered is reported,
   never sent);
2. every remote object is then verified by reading it back in full (`Store.verify`), also the
   ones that were already there: a corrupted remote object is caught, and reported — it is
   replaced only with `repair=True`.
The run's own files can be written while they are copied (records, logs, W&B), so each is copied
to `.backup/snapshot/` first and the snapshot is hashed, sent and verified.
Artifacts whose files all verify get `remote` recorded in the manifest. Garbage is never copied;
it is listed with its size. The run is "safe to shut down" only when every file verified.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from dflashx.store.base import ChecksumMismatch, Progress, Store
from dflashx.store.hashing import sha256_file
from dflashx.store.inventory import BACKUP_DIR, RUN_FILES, FileRef, artifact_files, remote_key, unregistered_files
from dflashx.store.manifest import Manifest, atomic_write_json, utc_now

Status = Literal["verified", "missing", "mismatch", "local-changed"]
SAFE = "safe to shut down"


@dataclass
class FileResult:
    artifact: str
    rel: str
    size: int
    status: Status
    uploaded: bool = False
    detail: str = ""


@dataclass
class BackupReport:
    remote: str
    files: list[FileResult] = field(default_factory=list)
    garbage: list[dict[str, Any]] = field(default_factory=list)  # {name, path, size}

    @property
    def ok(self) -> bool:
        return all(f.status == "verified" for f in self.files)

    @property
    def problems(self) -> list[FileResult]:
        return [f for f in self.files if f.status != "verified"]

    @property
    def bytes_verified(self) -> int:
        return sum(f.size for f in self.files if f.status == "verified")

    @property
    def bytes_uploaded(self) -> int:
        return sum(f.size for f in self.files if f.uploaded)

    def to_json(self) -> dict[str, Any]:
        return {"remote": self.remote, "ok": self.ok, "finished_at": utc_now(),
                "files": [asdict(f) for f in self.files], "garbage": self.garbage,
                "bytes_verified": self.bytes_verified,
                "bytes_uploaded": self.bytes_uploaded}


def _copy_one(store: Store, run_dir: Path, ref: FileRef, source: Path, verify_only: bool,
              repair: bool, progress: Progress | None) -> FileResult:
    """Make the remote copy of `ref` (sha256 known) match, sending `source` when it must."""
    assert ref.sha256 is not None
    key = remote_key(run_dir, ref.rel)
    result = FileResult(ref.artifact, ref.rel, ref.size, "verified")
    info = store.stat(key)
    needs_upload = info is None or info.sha256 != ref.sha256 or info.size != ref.size
    if needs_upload and verify_only:
        result.status, result.detail = ("missing", f"{store.uri(key)} is missing") if info is None \
            else ("mismatch", f"{store.uri(key)} records sha256 {info.sha256}, expected {ref.sha256}")
        return result
    if not needs_upload:
        try:
            store.verify(key, ref.sha256)
            return result
        except ChecksumMismatch as exc:
            if not repair:
                result.status, result.detail = "mismatch", str(exc)
                return result
    if not source.is_file():
        result.status, result.detail = "missing", f"no local copy at {source} to upload"
        return result
    if ref.artifact != RUN_FILES and sha256_file(source) != ref.sha256:
        result.status = "local-changed"
        result.detail = f"{source} changed since it was registered (sha256 differs from the manifest)"
        return result
    try:
        store.put(source, key, ref.sha256, progress)
        result.uploaded = True
    except ChecksumMismatch as exc:
        result.status, result.detail = "mismatch", str(exc)
    return result


def _copy_run_file(store: Store, run_dir: Path, ref: FileRef, verify_only: bool, repair: bool,
                   progress: Progress | None) -> FileResult | None:
    """An unregistered file may be written while it is copied (records, logs, W&B): a snapshot is
    hashed and sent instead. None when the file vanished meanwhile (a temporary file)."""
    live = run_dir / ref.rel
    source = live if verify_only else run_dir / BACKUP_DIR / "snapshot" / ref.rel
    try:
        if source != live:
            source.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(live, source)
        frozen = FileRef(ref.artifact, ref.rel, source.stat().st_size, sha256_file(source))
    except FileNotFoundError:
        return None
    try:
        return _copy_one(store, run_dir, frozen, source, verify_only, repair, progress)
    finally:
        if source != live:
            source.unlink(missing_ok=True)


def backup_run(run_dir: Path, store: Store, include_replaceable: bool = True,
               verify_only: bool = False, repair: bool = False, progress: Progress | None = None,
               on_file: Callable[[FileResult], None] | None = None,
               before_run_files: Callable[[Path], object] | None = None) -> BackupReport:
    """Back up and verify a run (module docstring); `before_run_files` runs (e.g. writing
    PROGRESS.md) after the artifacts are recorded and before the run's own files are sent."""
    run_dir = Path(run_dir).resolve()
    store.check_access()
    manifest = Manifest.load(run_dir)
    tiers = {"irreplaceable", "replaceable"} if include_replaceable else {"irreplaceable"}
    report = BackupReport(remote=store.uri(remote_key(run_dir, "")).rstrip("/"))
    report.garbage = [{"name": e.name, "path": e.path, "size": e.size}
                      for e in manifest.entries.values() if e.tier == "garbage"]

    def run(refs: list[FileRef]) -> list[FileResult]:
        results = []
        for ref in refs:
            result = _copy_one(store, run_dir, ref, run_dir / ref.rel, verify_only, repair, progress) \
                if ref.sha256 is not None else _copy_run_file(store, run_dir, ref, verify_only, repair, progress)
            if result is not None:
                results.append(result)
                if on_file is not None:
                    on_file(result)
        report.files.extend(results)
        return results

    for entry in sorted(manifest.entries.values(), key=lambda e: e.name):
        if entry.tier not in tiers or entry.sha256 is None:
            continue
        if all(r.status == "verified" for r in run(artifact_files(entry))):
            manifest.update_remote(entry.name, store.uri(remote_key(run_dir, entry.path)),
                                   entry.sha256, utc_now())
    if not verify_only:
        manifest.save()
        if before_run_files is not None:
            before_run_files(run_dir)
    run(unregistered_files(run_dir, Manifest.load(run_dir)))
    atomic_write_json(run_dir / BACKUP_DIR / "last.json", report.to_json())
    return report

