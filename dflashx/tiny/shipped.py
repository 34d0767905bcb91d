"""The built tiny target shipped inside the package, so the embedded default starts in seconds.

`dflashx target build-tiny` made the files in `dflashx/tiny/data/<variant>/`; `record.json` beside
them holds the build key they were made under and each file's sha256. When the key equals the
current build key (`dflashx.tiny.build.build_key`: the build settings and the source of the
modules that make the build), the files are the build's output and `copy_into` (called by `ensure_tiny_target`
under its build lock) copies them into the cache folder a build would fill, checking every sha256; a changed build
module changes the
key, and the target is built again instead (tests/test_tiny_shipped.py keeps the record honest).
`python -m dflashx.tiny.reship VARIANT` re-ships a fresh build's folder.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from dflashx.store.atomic import atomic_dir, atomic_write_json

DATA = Path(__file__).resolve().parent / "data"
RECORD = "record.json"
SHIPPED_FILES = ("build_report.json", "chat_template.jinja", "config.json", "generation_config.json",
                 "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def record(variant: str) -> dict | None:
    """The shipped record of `variant` ({key, files: {name: sha256}}), or None when none ships."""
    path = DATA / variant / RECORD
    return json.loads(path.read_text()) if path.is_file() else None


def verify(variant: str) -> list[str]:
    """Problems with the shipped files of `variant` against their record (empty: all good)."""
    rec = record(variant)
    if rec is None:
        return [f"no {RECORD} for {variant}"]
    folder = DATA / variant
    return [f"{name}: sha256 differs from {RECORD}" if (folder / name).is_file() else f"{name}: missing"
            for name, sha in rec["files"].items()
            if not (folder / name).is_file() or _sha256(folder / name) != sha]


def record_under(variant: str, key: str) -> dict | None:
    """The shipped record of `variant` when that build was made under `key`, else None."""
    rec = record(variant)
    return rec if rec is not None and rec["key"] == key else None


def copy_into(variant: str, key: str, folder: Path) -> bool:
    """Copy the shipped build of `variant` into the empty `folder` when it was made under `key`;
    False when nothing matching ships (the caller builds). A damaged file stops with its name."""
    rec = record_under(variant, key)
    if rec is None:
        return False
    problems = verify(variant)
    if problems:
        raise RuntimeError(f"the shipped tiny target is damaged ({'; '.join(problems)}); reinstall dflashx "
                           "or rebuild it with `dflashx target build-tiny --rebuild`")
    for name in rec["files"]:
        shutil.copyfile(DATA / variant / name, folder / name)
    return True


def ship(variant: str, built: Path) -> Path:
    """Copy a built folder into the package data with its record (the maintainers' step)."""
    report = json.loads((built / "build_report.json").read_text())
    with atomic_dir(DATA / variant) as tmp:
        for name in SHIPPED_FILES:
            shutil.copyfile(built / name, tmp / name)
        atomic_write_json(tmp / RECORD, {"variant": variant, "key": report["key"],
                                         "files": {n: _sha256(tmp / n) for n in SHIPPED_FILES}})
    return DATA / variant
