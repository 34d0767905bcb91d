"""The run's manifest: every artifact of a run with its size, sha256, producer, inputs and tier.

File: `<run_dir>/manifest.json`, written atomically (`dflashx.store.atomic`)::

    {"version": 1,
     "artifacts": {"<stage>.<artifact>": ArtifactEntry, ...}}

ArtifactEntry (a pydantic model, fields below) is keyed by its dotted `name`:
    name            "<stage>.<artifact>", e.g. "generate.completions". Superseded outputs are
                    renamed "<stage>.<artifact>@<moved folder>" and marked garbage.
    stage, artifact producing stage and the artifact's short name
    path            relative to the run dir, posix ("generate/completions")
    kind            "file" | "dir"
    size            bytes (a folder: sum of its files)
    sha256          file sha256, or the folder hash of `dflashx.store.hashing` (None: not hashed,
                    e.g. garbage registered without reading it)
    files           folders only: {relative path: {size, sha256}} so backups verify file by file
    tier            "irreplaceable" | "replaceable" | "garbage"
    inputs          dotted names of the artifacts this one was made from
    stage_key       the producing stage's key (see `dflashx.run.keys`)
    regen_cost_usd  planner's cost to make it again (replaceable artifacts), or None
    created_at      ISO-8601 UTC
    remote          None or {uri, sha256, verified_at}: the verified copy made by `dflashx backup`

Readers and writers: the orchestrator registers stage outputs; backup/inventory/gc read entries and
call `update_remote` / `mark_garbage`, then `save()`. Load, change and save promptly: the orchestrator
reloads the file after every stage, so changes saved by a stage (e.g. backup) are kept.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from dflashx.store.atomic import atomic_write_json, atomic_write_text  # noqa: F401 - also imported from here
from dflashx.store.hashing import digest_path

Tier = Literal["irreplaceable", "replaceable", "garbage"]
MANIFEST_FILE = "manifest.json"
VERSION = 1


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileEntry(_Model):
    size: int
    sha256: str


class RemoteCopy(_Model):
    uri: str
    sha256: str
    verified_at: str


class ArtifactEntry(_Model):
    name: str
    stage: str
    artifact: str
    path: str
    kind: Literal["file", "dir"]
    size: int
    sha256: str | None
    files: dict[str, FileEntry] | None = None
    tier: Tier
    inputs: list[str] = []
    stage_key: str | None = None
    regen_cost_usd: float | None = None
    description: str = ""
    created_at: str
    remote: RemoteCopy | None = None


class Manifest:
    """In-memory view of `<run_dir>/manifest.json`; `save()` writes it back atomically."""

    def __init__(self, run_dir: Path, entries: dict[str, ArtifactEntry] | None = None):
        self.run_dir = Path(run_dir)
        self.entries: dict[str, ArtifactEntry] = entries or {}

    @property
    def path(self) -> Path:
        return self.run_dir / MANIFEST_FILE

    @classmethod
    def load(cls, run_dir: str | os.PathLike[str]) -> Manifest:
        """Read the manifest of a run dir (an empty one if the file does not exist yet)."""
        run_dir = Path(run_dir)
        file = run_dir / MANIFEST_FILE
        if not file.exists():
            return cls(run_dir)
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
            entries = {k: ArtifactEntry.model_validate(v) for k, v in data["artifacts"].items()}
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{file}: not a dflashx manifest ({e}); restore it from a backup") from e
        return cls(run_dir, entries)

    def save(self) -> None:
        data = {"version": VERSION,
                "artifacts": {k: v.model_dump(mode="json") for k, v in sorted(self.entries.items())}}
        atomic_write_json(self.path, data)

    def _relative(self, path: str | os.PathLike[str]) -> Path:
        full = Path(path) if Path(path).is_absolute() else self.run_dir / path
        try:
            return full.resolve().relative_to(self.run_dir.resolve())
        except ValueError:
            raise ValueError(f"artifact {full} is outside the run dir {self.run_dir}") from None

    def register(
        self,
        stage: str,
        name: str,
        path: str | os.PathLike[str],
        tier: Tier,
        inputs: Iterable[str] = (),
        regen_cost_usd: float | None = None,
        *,
        stage_key: str | None = None,
        description: str = "",
        hash_content: bool = True,
    ) -> ArtifactEntry:
        """Hash `path` (absolute or relative to the run dir) and record it as `<stage>.<name>`.

        Replaces an entry of the same name (keeping nothing of it). Call `save()` afterwards.
        """
        rel = self._relative(path)
        digest = digest_path(self.run_dir / rel, content=hash_content)
        files = None
        if digest.files is not None:
            files = {k: FileEntry(size=v.size, sha256=v.sha256) for k, v in digest.files.items()}
        entry = ArtifactEntry(
            name=f"{stage}.{name}", stage=stage, artifact=name, path=rel.as_posix(), kind=digest.kind,
            size=digest.size, sha256=digest.sha256 or None, files=files, tier=tier, inputs=list(inputs),
            stage_key=stage_key, regen_cost_usd=regen_cost_usd, description=description,
            created_at=utc_now(),
        )
        self.entries[entry.name] = entry
        return entry

    def get(self, name: str) -> ArtifactEntry | None:
        return self.entries.get(name)

    def by_stage(self, stage: str, *, include_garbage: bool = False) -> list[ArtifactEntry]:
        return [e for e in self.entries.values()
                if e.stage == stage and (include_garbage or e.tier != "garbage")]

    def live(self) -> list[ArtifactEntry]:
        """Every entry that is not garbage."""
        return [e for e in self.entries.values() if e.tier != "garbage"]

    def mark_garbage(self, names: str | Iterable[str]) -> None:
        for name in [names] if isinstance(names, str) else names:
            self._require(name).tier = "garbage"

    def supersede(self, stage: str, moved_to: str) -> list[ArtifactEntry]:
        """A stage folder was moved to `moved_to` (relative to the run dir): re-point its live
        entries there, rename them `<name>@<moved_to>` and mark them garbage."""
        moved = []
        for entry in self.by_stage(stage):
            del self.entries[entry.name]
            if entry.path == stage or entry.path.startswith(f"{stage}/"):
                entry.path = moved_to + entry.path[len(stage):]
            entry.name = f"{entry.name}@{moved_to}"
            entry.tier = "garbage"
            self.entries[entry.name] = entry
            moved.append(entry)
        return moved

    def update_remote(self, name: str, uri: str, sha256: str, verified_at: str | datetime) -> ArtifactEntry:
        """Record a verified remote copy of artifact `name` (its dotted name)."""
        entry = self._require(name)
        if isinstance(verified_at, datetime):
            verified_at = verified_at.astimezone(UTC).isoformat(timespec="seconds")
        entry.remote = RemoteCopy(uri=uri, sha256=sha256, verified_at=verified_at)
        return entry

    def _require(self, name: str) -> ArtifactEntry:
        if name not in self.entries:
            raise KeyError(f"no artifact {name!r} in {self.path}; known: {', '.join(sorted(self.entries)) or 'none'}")
        return self.entries[name]
