"""The training data path: the tokenize stage's Arrow dataset, a resumable per-rank sampler and
the padding collate.

Public API: `load_token_dataset(path) -> datasets.Dataset`, `ResumableSampler`,
`collate(rows, pad_id) -> dict[str, Tensor]` (input_ids, loss_mask, attention_mask, index),
`make_loader(dataset, micro_batch, rank, world, seed, epoch, skip_batches, pad_id)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

REQUIRED_COLUMNS = ("input_ids", "loss_mask", "length")


def load_token_dataset(path: str | Path):
    """Open a `datasets` folder written by save_to_disk and check its columns."""
    from datasets import load_from_disk

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: tokenized dataset not found (input `tokenize.dataset`); "
                                "run the tokenize stage")
    ds = load_from_disk(str(path))
    missing = [c for c in REQUIRED_COLUMNS if c not in ds.column_names]
    if missing:
        raise ValueError(
            f"{path}: dataset lacks column(s) {missing}; the train stage needs {list(REQUIRED_COLUMNS)} "
            "as the tokenize stage writes them"
        )
    if len(ds) == 0:
        raise ValueError(f"{path}: dataset is empty; check the QC/tokenize stage reports")
    return ds.select_columns(list(REQUIRED_COLUMNS))


class _Indexed(Dataset):
    """Rows with their dataset index (the anchor draw is seeded by it)."""

    def __init__(self, ds: Any, max_length: int | None):
        self.ds, self.max_length = ds, max_length

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.ds[int(i)]
        cut = self.max_length or len(row["input_ids"])
        return {"input_ids": row["input_ids"][:cut], "loss_mask": row["loss_mask"][:cut], "index": int(i)}


class ResumableSampler(DistributedSampler):
    """DistributedSampler (this rank's shard, reshuffled per epoch) that can skip a prefix."""

    def __init__(self, dataset: Dataset, world: int, rank: int, seed: int, skip: int = 0):
        super().__init__(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.skip = skip

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        return iter(indices[self.skip :])

    def __len__(self) -> int:
        return self.num_samples - self.skip


def collate(rows: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest row of the micro batch."""
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width), dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n] = torch.tensor(r["input_ids"])
        loss_mask[i, :n] = torch.tensor(r["loss_mask"])
        attn[i, :n] = 1
    return {"input_ids": ids, "loss_mask": loss_mask, "attention_mask": attn,
            "index": torch.tensor([r["index"] for r in rows])}


def make_loader(
    ds: Any, micro_batch: int, rank: int, world: int, seed: int, epoch: int, skip_batches: int, pad_id: int,
    max_length: int | None = None,
) -> DataLoader:
    """This rank's loader for `epoch`, starting after `skip_batches` micro batches (resume)."""
    indexed = _Indexed(ds, max_length)
    sampler = ResumableSampler(indexed, world, rank, seed, skip=skip_batches * micro_batch)
    sampler.set_epoch(epoch)
    return DataLoader(
        indexed, batch_size=micro_batch, sampler=sampler, drop_last=True, collate_fn=lambda rows: collate(rows, pad_id)
    )
