"""Shared test settings: quiet offline W&B, DeepSpeed on the CPU accelerator."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_DISABLE_GIT", "true")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]

# One SeaweedFS server for the whole session (the S3 tests take these fixtures by name).
from s3_fixtures import s3_env, s3_server, s3_spec  # noqa: E402,F401

# A real small file system (tmpfs) for the disk-full tests.
from helpers_disk import small_fs  # noqa: E402,F401
