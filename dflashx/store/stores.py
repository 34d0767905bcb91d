"""Which store a run's remote is: a local folder, the recipe's S3 bucket, or none.

Kept out of `dflashx.store.base` so that the backends import the interface and nothing imports
back: base <- local, s3 <- stores.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dflashx.store.base import Store
from dflashx.store.local import LocalStore

if TYPE_CHECKING:
    from dflashx.config.schema import S3Spec


def open_store(s3: S3Spec | None, state_dir: Path, to: str | None = None) -> Store | None:
    """The remote of a run: the folder `to` when given, else the recipe's S3 bucket, else None."""
    if to is not None:
        return LocalStore(to)
    if s3 is None:
        return None
    from dflashx.store.s3 import S3Store  # boto3 is slow to import: only for an S3 remote

    return S3Store(s3, state_dir)
