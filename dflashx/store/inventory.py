"""What a run holds and where: one row per artifact, checked against the manifest.

Besides the registered artifacts a run folder holds files no stage registered — recipe.yaml,
plan.json, records.jsonl, manifest.json, PROGRESS.md, provenance, W&B offline runs, a stage's
partial output. They are reported (and backed up) as the pseudo-artifact `run` with tier
`irreplaceable`. Superseded stage folders (`<stage>.superseded-<key8>/`) and top-level dot entries
(the backup state folder `.backup/`, the run lock `.lock`) are left out. Remote keys are `<run folder name>/<path
relative to the run>`.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dflashx.config.schema import StorageSpec
from dflashx.store.base import Store
from dflashx.store.hashing import sha256_file
from dflashx.store.manifest import ArtifactEntry, Manifest
from dflashx.store.stores import open_store

BACKUP_DIR = ".backup"
RUN_FILES = "run"  # pseudo-artifact name for unregistered files
TIERS = ("irreplaceable", "replaceable", "garbage")


@dataclass(frozen=True)
class FileRef:
    """One file of an artifact, the unit of backup and verification."""

    artifact: str  # dotted artifact name, or RUN_FILES
    rel: str  # posix path relative to the run dir
    size: int
    sha256: str | None  # None for unregistered files: hashed when needed


def remote_key(run_dir: Path, rel: str) -> str:
    return f"{Path(run_dir).resolve().name}/{rel}"


def run_storage(run_dir: Path) -> StorageSpec:
    """The `storage` section of the run's saved recipe (defaults when there is none)."""
    recipe = Path(run_dir) / "recipe.yaml"
    if not recipe.is_file():
        return StorageSpec()
    data = yaml.safe_load(recipe.read_text()) or {}
    try:
        return StorageSpec.model_validate(data.get("storage") or {})
    except ValueError as exc:
        raise ValueError(f"{recipe}: key `storage` is not valid ({exc}); fix the run's recipe.yaml") from exc


def artifact_files(entry: ArtifactEntry) -> list[FileRef]:
    if entry.kind == "file" or entry.files is None:
        return [FileRef(entry.name, entry.path, entry.size, entry.sha256)]
    return [FileRef(entry.name, f"{entry.path}/{rel}", f.size, f.sha256)
            for rel, f in sorted(entry.files.items())]


def _excluded(rel: str, registered: set[str]) -> bool:
    top = rel.split("/", 1)[0]
    if top.startswith(".") or ".superseded-" in top:  # .backup/, .lock
        return True
    parts = rel.split("/")
    return any("/".join(parts[:i]) in registered for i in range(1, len(parts) + 1))


def unregistered_files(run_dir: Path, manifest: Manifest) -> list[FileRef]:
    """Files of the run folder that belong to no registered artifact (see module docstring)."""
    registered = {e.path for e in manifest.entries.values()}
    found = []
    for root, dirs, names in os.walk(run_dir):
        dirs.sort()
        for name in sorted(names):
            full = Path(root, name)
            rel = full.relative_to(run_dir).as_posix()
            if full.is_file() and not name.endswith(".tmp") and not _excluded(rel, registered):
                found.append(FileRef(RUN_FILES, rel, full.stat().st_size, None))
    return found


@dataclass
class InventoryRow:
    name: str
    stage: str
    tier: str
    size: int
    files: int
    local: str  # ok | missing | changed | partial
    remote: str  # ok | missing | differs | partial | no remote
    verified_at: str | None = None  # last sha256 verification of the remote copy (manifest)

    @property
    def where(self) -> str:
        here, there = self.local != "missing", self.remote not in ("missing", "no remote")
        return {(True, True): "both", (True, False): "local", (False, True): "remote"}.get(
            (here, there), "nowhere")


@dataclass
class Inventory:
    rows: list[InventoryRow]
    remote: str | None  # the run's remote root, None without a remote
    totals: dict[str, dict[str, int]] = field(default_factory=dict)


def _local_state(run_dir: Path, refs: list[FileRef], rehash: bool) -> str:
    states = []
    for ref in refs:
        path = run_dir / ref.rel
        if not path.is_file():
            states.append("missing")
        elif path.stat().st_size != ref.size or (
                rehash and ref.sha256 is not None and sha256_file(path) != ref.sha256):
            states.append("changed")
        else:
            states.append("ok")
    return _summarise(states)


def _summarise(states: list[str]) -> str:
    if not states or all(s == "ok" for s in states):
        return "ok"
    if "changed" in states or "differs" in states:
        return "changed" if "changed" in states else "differs"
    return "missing" if all(s == "missing" for s in states) else "partial"


def _remote_state(run_dir: Path, refs: list[FileRef], index: dict[str, int] | None) -> str:
    if index is None:
        return "no remote"
    states = []
    for ref in refs:
        size = index.get(remote_key(run_dir, ref.rel))
        states.append("missing" if size is None else "ok" if size == ref.size else "differs")
    return _summarise(states)


def build_inventory(run_dir: Path, store: Store | None, rehash: bool = False) -> Inventory:
    """Check every artifact locally (sizes; sha256 too with `rehash`) and on the remote (sizes)."""
    run_dir = Path(run_dir)
    manifest = Manifest.load(run_dir)
    index = None
    if store is not None:
        index = {info.key: info.size for info in store.list(remote_key(run_dir, ""))}
    rows = []
    for entry in sorted(manifest.entries.values(), key=lambda e: (e.tier, e.name)):
        refs = artifact_files(entry)
        rows.append(InventoryRow(entry.name, entry.stage, entry.tier, entry.size, len(refs),
                                 _local_state(run_dir, refs, rehash),
                                 _remote_state(run_dir, refs, index),
                                 entry.remote.verified_at if entry.remote else None))
    extra = unregistered_files(run_dir, manifest)
    if extra:
        rows.append(InventoryRow(RUN_FILES, "-", "irreplaceable", sum(r.size for r in extra),
                                 len(extra), "ok", _remote_state(run_dir, extra, index)))
    return Inventory(rows, store.uri(remote_key(run_dir, "")) if store else None, _totals(rows))


def _totals(rows: list[InventoryRow]) -> dict[str, dict[str, int]]:
    totals = {tier: {"artifacts": 0, "bytes": 0, "local_bytes": 0, "remote_bytes": 0} for tier in TIERS}
    for row in rows:
        t = totals[row.tier]
        t["artifacts"] += 1
        t["bytes"] += row.size
        t["local_bytes"] += row.size if row.where in ("local", "both") else 0
        t["remote_bytes"] += row.size if row.where in ("remote", "both") else 0
    return totals


def collect_garbage(run_dir: Path, store: Store | None = None) -> list[ArtifactEntry]:
    """Delete every garbage artifact (locally, and its remote copy when `store` is given),
    drop it from the manifest, and remove superseded folders left with nothing registered."""
    run_dir = Path(run_dir)
    manifest = Manifest.load(run_dir)
    garbage = [e for e in manifest.entries.values() if e.tier == "garbage"]
    for entry in garbage:
        path = run_dir / entry.path
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        if store is not None:
            for ref in artifact_files(entry):
                store.delete(remote_key(run_dir, ref.rel))
        del manifest.entries[entry.name]
    manifest.save()
    kept_tops = {e.path.split("/", 1)[0] for e in manifest.entries.values()}
    for folder in run_dir.glob("*.superseded-*"):
        if folder.is_dir() and folder.name not in kept_tops:
            shutil.rmtree(folder)
    return garbage


def run_remote(run_dir: Path, to: str | None = None) -> Store | None:
    """The run's remote store: the folder `to`, else the run recipe's storage.s3, else None."""
    return open_store(run_storage(run_dir).s3, Path(run_dir) / BACKUP_DIR / "uploads", to)
