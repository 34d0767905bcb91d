"""Tokenize stage: completion shards -> a `datasets` Arrow dataset with assistant loss masks.

Reads `generate.completions` (JSONL shards), renders each conversation with the target's chat
template (`target.chat_template.enable_thinking` and `.kwargs`), encodes it with the fast tokenizer
and masks exactly the assistant output (see `dflashx.data.chat_mask`). Applies the max-length
policy (`stages.tokenize.max_length`, `overflow: truncate|drop`), drops samples with fewer than
`min_loss_tokens_blocks x drafter.block_size` loss tokens (and records that failed generation),
and writes `dataset/` with `save_to_disk`: columns `input_ids` (int32), `loss_mask` (uint8),
`length`, `source`, `id`.

Memory stays flat in the number of samples: the shards are read as lines into an Arrow file
(`datasets` "text" loader), a multiprocess batched `map` writes the encoded rows to Arrow files
batch by batch, and `save_to_disk` streams them into the final shards.

A disk that fills stops the stage (`StageFailed`: the folder, the space free, about the space
needed) with the scratch files removed and an earlier `dataset/` untouched; rerunning starts over.

The folder is byte-for-byte a function of its content (the Arrow shards and dataset_info.json
already are, whatever num_proc): `datasets` records in `state.json` a `_fingerprint` hashed from
the input files' paths and mtimes and the tokenizer's path, and num_proc > 1 drops its `_split`;
`seal_dataset` rewrites both from the content, so the manifest's sha256 (and every downstream
stage key) is the same for the same samples in any run folder.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dflashx.data import chat_contract
from dflashx.data.chat_mask import ChatMasker, completion_messages
from dflashx.resolve.formulas import min_loss_tokens
from dflashx.stages.base import Artifact, StageFailed, StageResult, TokenizeContext
from dflashx.stages.graph import input_name
from dflashx.store.atomic import replace_dir
from dflashx.store.diskspace import DiskFull, size_text, stop_when_full, used_bytes
from dflashx.data.jsonl import shard_paths
from dflashx.store.hashing import sha256_file
from dflashx.targets.locate import locate_tokenizer

DATASET_DIR = "dataset"
WORK_DIR = "_work"
DROP_REASONS = ("too_long", "few_loss_tokens", "generation_error")
SPLIT = "train"
STATE_FILE = "state.json"
INFO_FILE = "dataset_info.json"
SCRATCH_COPIES = 3  # peak scratch: the text cache, then encoded, kept and saved copies of the dataset


@dataclass(frozen=True)
class TokenizePolicy:
    """What to keep: the max-length policy and the minimum number of loss tokens."""

    max_length: int
    overflow: str = "truncate"  # truncate | drop
    min_loss_tokens: int = 0


def output_features():
    from datasets import Features, List, Value

    return Features({
        "id": Value("string"),
        "source": Value("string"),
        "input_ids": List(Value("int32")),
        "loss_mask": List(Value("uint8")),
        "length": Value("int32"),
        "loss_tokens": Value("int32"),
        "drop": Value("string"),
    })


class BatchEncoder:
    """The `map` function: JSONL lines -> encoded rows. Picklable; loads the tokenizer lazily."""

    def __init__(self, tokenizer_path: str | Path, policy: TokenizePolicy, enable_thinking: bool = True,
                 template_kwargs: dict[str, Any] | None = None):
        self.tokenizer_path = str(tokenizer_path)
        self.policy = policy
        self.enable_thinking = enable_thinking
        self.template_kwargs = dict(template_kwargs or {})
        self._masker: ChatMasker | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_masker": None}

    @property
    def masker(self) -> ChatMasker:
        if self._masker is None:
            self._masker = ChatMasker.from_path(
                self.tokenizer_path, enable_thinking=self.enable_thinking, template_kwargs=self.template_kwargs
            )
        return self._masker

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, list[Any]]:
        records = [json.loads(line) for line in batch["text"] if line.strip()]
        good = [r for r in records if not r.get("error")]
        encoded = iter(self.masker.encode_conversations([(completion_messages(r), r.get("tools")) for r in good]))
        out: dict[str, list[Any]] = {k: [] for k in ("id", "source", "input_ids", "loss_mask", "length",
                                                       "loss_tokens", "drop")}
        empty = np.zeros(0, dtype=np.int32)
        for record in records:
            if record.get("error"):
                ids, mask, drop = empty, empty.astype(np.uint8), "generation_error"
            else:
                enc = next(encoded)
                ids, mask, drop = self._apply_policy(np.asarray(enc.input_ids, dtype=np.int32), enc.loss_mask)
            out["id"].append(record["id"])
            out["source"].append(record.get("source") or "")
            out["length"].append(len(ids))
            out["loss_tokens"].append(int(mask.sum()))
            out["drop"].append(drop)
            keep = not drop
            out["input_ids"].append(ids if keep else empty)
            out["loss_mask"].append(mask if keep else mask[:0])
        return out

    def _apply_policy(self, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
        p = self.policy
        if len(ids) > p.max_length:
            if p.overflow == "drop":
                return ids, mask, "too_long"
            ids, mask = ids[: p.max_length], mask[: p.max_length]
        if int(mask.sum()) < p.min_loss_tokens:
            return ids, mask, "few_loss_tokens"
        return ids, mask, ""


def _token_metrics(ds: Any) -> dict[str, Any]:
    """Counts over every encoded sample (kept and dropped), grouped in Arrow from small columns."""
    import pyarrow.compute as pc

    table = ds.data.table.select(["source", "drop", "length", "loss_tokens"])
    groups = table.group_by(["source", "drop"]).aggregate(
        [("length", "sum"), ("loss_tokens", "sum"), ("length", "count")]).to_pylist()
    per_source: dict[str, dict[str, int]] = {}
    reasons: Counter = Counter()
    for g in groups:
        s = per_source.setdefault(g["source"], {"samples": 0, "tokens": 0, "loss_tokens": 0, "dropped": 0})
        if g["drop"]:
            s["dropped"] += g["length_count"]
            reasons[g["drop"]] += g["length_count"]
        else:
            s.update(samples=g["length_count"], tokens=g["length_sum"], loss_tokens=g["loss_tokens_sum"])
    kept = table.filter(pc.equal(table["drop"], ""))["length"]
    samples = sum(s["samples"] for s in per_source.values())
    return {
        "samples_in": table.num_rows,
        "samples": samples,
        "tokens": sum(s["tokens"] for s in per_source.values()),
        "loss_tokens": sum(s["loss_tokens"] for s in per_source.values()),
        "length_mean": pc.mean(kept).as_py() if samples else 0.0,
        "length_max": pc.max(kept).as_py() if samples else 0,
        "dropped": sum(reasons.values()),
        "dropped_by_reason": {r: reasons.get(r, 0) for r in DROP_REASONS},
        "per_source": per_source,
    }


def seal_dataset(folder: str | Path) -> str:
    """Make a `save_to_disk` folder's `state.json` a function of its content; return the fingerprint.

    `_fingerprint` becomes a hash of every data file (name and sha256, in the state's order),
    `dataset_info.json` and the rest of the state, so it changes exactly when the content does;
    `_split` is always "train" (`map` with num_proc > 1 concatenates its workers' shards and drops
    it). The file is written as `datasets` writes it (indent 2, sorted keys).
    """
    folder = Path(folder)
    state = json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
    state.pop("_fingerprint", None)
    state["_split"] = SPLIT
    h = hashlib.sha256(json.dumps(state, sort_keys=True).encode())
    for name in [f["filename"] for f in state["_data_files"]] + [INFO_FILE]:
        h.update(f"{name}\0{sha256_file(folder / name)}\n".encode())
    state["_fingerprint"] = h.hexdigest()[:16]
    (folder / STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True), encoding="utf-8")
    return state["_fingerprint"]


def tokenize_completions(completions: str | Path, out_dir: str | Path, tokenizer_path: str | Path,
                         policy: TokenizePolicy, enable_thinking: bool = True,
                         template_kwargs: dict[str, Any] | None = None, num_proc: int = 1,
                         shard_size: int = 10_000, batch_size: int = 256,
                         dataset_bytes: float | None = None) -> dict[str, Any]:
    """Tokenize a folder (or file) of completion JSONL shards into `out_dir/dataset`; return metrics.

    The new dataset replaces an old one only once it is complete. A disk that fills on the way
    raises `DiskFull` after removing the scratch files; `dataset_bytes` (the plan's size of the
    dataset; default: the input's size) sizes the space it says is needed."""
    from datasets import disable_progress_bars, load_dataset

    disable_progress_bars()
    shards = [str(p) for p in shard_paths(completions)]
    if not shards:
        raise FileNotFoundError(f"{completions}: no completion shards (shard-*.jsonl) to tokenize")
    out_dir = Path(out_dir)
    work, final, tmp = out_dir / WORK_DIR, out_dir / DATASET_DIR, out_dir / f".{DATASET_DIR}.tmp"
    source_bytes = used_bytes(completions)
    needed = source_bytes + SCRATCH_COPIES * (dataset_bytes or source_bytes)

    def scratch_away() -> None:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)

    scratch_away()
    with stop_when_full(out_dir, "the tokenized dataset", needed, cleanup=scratch_away,
                        basis=f"the completions' {size_text(source_bytes)} as scratch text plus {SCRATCH_COPIES} "
                              f"copies of the dataset: encoded, kept, saved"):
        lines = load_dataset("text", data_files=shards, split=SPLIT, cache_dir=str(work / "lines"))
        encoder = BatchEncoder(tokenizer_path, policy, enable_thinking, template_kwargs)
        encoded = lines.map(
            encoder, batched=True, batch_size=batch_size, num_proc=num_proc if num_proc > 1 else None,
            remove_columns=["text"], features=output_features(), writer_batch_size=batch_size,
            cache_file_name=str(work / "encoded.arrow"), desc="tokenize",
        )
        metrics = _token_metrics(encoded)
        kept = encoded.filter(
            lambda drops: [d == "" for d in drops], input_columns="drop", batched=True,
            num_proc=num_proc if num_proc > 1 else None, cache_file_name=str(work / "kept.arrow"),
        ).remove_columns(["drop", "loss_tokens"])
        kept.save_to_disk(str(tmp), num_shards=max(1, math.ceil(len(kept) / shard_size)))
        seal_dataset(tmp)
        replace_dir(tmp, final)
    del lines, encoded, kept
    shutil.rmtree(work, ignore_errors=True)
    return metrics


def run(ctx: TokenizeContext) -> StageResult:
    cfg = ctx.config
    recipe = ctx.recipe
    policy = TokenizePolicy(
        max_length=cfg.max_length,
        overflow=cfg.overflow,
        min_loss_tokens=min_loss_tokens(cfg.min_loss_tokens_blocks, recipe.drafter.block_size),
    )
    try:
        metrics = tokenize_completions(
            ctx.inputs[input_name("tokenize")], ctx.out_dir, locate_tokenizer(recipe.target), policy,
            enable_thinking=recipe.target.chat_template.enable_thinking,
            template_kwargs=recipe.target.chat_template.kwargs, num_proc=cfg.num_proc, shard_size=cfg.shard_size,
            dataset_bytes=ctx.runtime.estimates.storage_bytes,
        )
    except DiskFull as e:
        raise StageFailed(str(e)) from e
    # the template and thinking mode these samples were rendered with: train refuses any other
    chat_contract.write(ctx.out_dir / DATASET_DIR, chat_contract.recipe_contract(recipe.target))
    ctx.log({f"tokenize/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))})
    return StageResult(
        artifacts={"dataset": Artifact(DATASET_DIR, description="Tokenized samples with assistant loss masks")},
        metrics=metrics,
    )
