"""Offline mode: capture the tapped layers once into safetensors shards, then train from them.

Only used when the plan allows it (`stages.train.mode: offline`; the planner checks the storage
budget: k x H x 2 bytes per token). Each rank captures the rows i with i % world == rank, in
chunks of `rows_per_shard`, into `<folder>/shard-r<rank>-<n>.safetensors` (one tensor per row,
key = row index, [length, k*H]) written atomically; `<folder>/done-r<rank>-w<world>` marks a
finished rank so a resumed job does not capture again. Every rank then reads any row back.

Public API: `write_features(capture, ds, folder, rank, world, pad_id, max_length, device)`,
`OfflineFeatures(folder).batch(indices, width) -> [b, width, k*H]` (zero-padded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dflashx.dflash.capture import FeatureCapture
from dflashx.store.atomic import atomic_path, atomic_write_text


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def write_features(
    capture: FeatureCapture, ds: Any, folder: Path, rank: int, world: int, pad_id: int,
    max_length: int | None, device: torch.device, rows_per_shard: int = 256,
) -> None:
    """Capture this rank's rows into shards (skipped when already done), then wait for all ranks."""
    folder.mkdir(parents=True, exist_ok=True)
    done = folder / f"done-r{rank}-w{world}"
    if not done.exists():
        mine = list(range(rank, len(ds), world))
        for n, start in enumerate(range(0, len(mine), rows_per_shard)):
            tensors = {}
            for i in mine[start : start + rows_per_shard]:
                ids = ds[i]["input_ids"][: max_length or None]
                feats = capture.capture(torch.tensor([ids], device=device))
                tensors[str(i)] = feats[0].cpu().contiguous()
            with atomic_path(folder / f"shard-r{rank}-{n:05d}.safetensors") as tmp:
                save_file(tensors, str(tmp))
        atomic_write_text(done, str(len(mine)))
    _barrier()


class OfflineFeatures:
    """Random access to captured rows across all shards of a folder."""

    def __init__(self, folder: Path):
        self._where: dict[int, Path] = {}
        for shard in sorted(Path(folder).glob("shard-*.safetensors")):
            with safe_open(str(shard), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open is not iterable
                    self._where[int(key)] = shard
        if not self._where:
            raise FileNotFoundError(f"{folder}: no feature shards; run with stages.train.mode=offline to capture them")

    def row(self, index: int) -> torch.Tensor:
        if index not in self._where:
            raise KeyError(f"row {index} has no captured features; delete the features folder to capture again")
        with safe_open(str(self._where[index]), framework="pt") as f:
            return f.get_tensor(str(index))

    def batch(self, indices: list[int], width: int) -> torch.Tensor:
        rows = [self.row(i) for i in indices]
        out = torch.zeros(len(rows), width, rows[0].shape[-1], dtype=rows[0].dtype)
        for j, r in enumerate(rows):
            out[j, : r.shape[0]] = r[:width]
        return out
