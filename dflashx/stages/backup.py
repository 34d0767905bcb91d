"""Stage `backup`: copy the run to the recipe's S3 bucket and verify every copy.

The same function as `dflashx backup RUN_DIR` (`dflashx.store.backup.backup_run`). Writes the
receipt `backup.json` (the orchestrator rewrites PROGRESS.md as each stage starts, so the copy
holds the run's state up to this stage); fails (StageFailed) unless every file verified.
"""

from __future__ import annotations

from dflashx.stages.base import Artifact, BackupContext, StageFailed, StageResult
from dflashx.store.backup import backup_run
from dflashx.store.base import StoreError
from dflashx.store.inventory import BACKUP_DIR
from dflashx.store.manifest import atomic_write_json
from dflashx.store.s3 import S3Store


def run(ctx: BackupContext) -> StageResult:
    spec = ctx.recipe.storage.s3
    if spec is None:
        raise StageFailed("stage backup needs storage.s3 (bucket, endpoint_url, path_style) in the "
                          "recipe; set it, or set stages.backup.enabled=false")
    store = S3Store(spec, ctx.run_dir / BACKUP_DIR / "uploads")
    try:
        report = backup_run(ctx.run_dir, store, include_replaceable=ctx.config.include_replaceable)
    except StoreError as exc:
        raise StageFailed(str(exc)) from exc
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(ctx.out_dir / "backup.json", report.to_json())
    metrics = {"files": len(report.files), "problems": len(report.problems),
               "bytes_uploaded": report.bytes_uploaded,
               "bytes_verified": report.bytes_verified,
               "garbage_bytes": sum(g["size"] for g in report.garbage)}
    ctx.log(metrics)
    if not report.ok:
        listed = "; ".join(f"{p.rel}: {p.status}" for p in report.problems[:10])
        raise StageFailed(f"backup to {report.remote} incomplete, {len(report.problems)} file(s) "
                          f"not verified: {listed}", metrics)
    return StageResult(
        artifacts={"receipt": Artifact("backup.json", tier="irreplaceable",
                                       description=f"verified copy at {report.remote}")},
        metrics=metrics)
