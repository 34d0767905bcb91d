"""What the QC gate reads, normalised to one sample shape.

Three inputs are accepted:
- the generate stage's completion shards (or one JSONL file of completion records);
- plain chat JSONL as other tools write it: `{"messages": [...]}` whose last assistant turn holds
  the reasoning in a `reasoning_content` field or inline as `<think>…</think>` in its content;
- a tokenized `datasets` folder (`save_to_disk`, with `input_ids` and `loss_mask`): loss-mask sizes
  are exact; reasoning and answer are only known when a tokenizer can decode the masked tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from dflashx.data.chat_mask import THINK_CLOSE, THINK_OPEN, completion_messages, split_think
from dflashx.data.jsonl import JsonlLineError, iter_numbered


class QCInputError(ValueError):
    """The QC input is not one of the accepted shapes (the message names the file and line)."""


@dataclass
class QCSample:
    """One response as the checks see it; None means "not known for this input"."""

    id: str
    source: str
    reasoning: str | None
    answer: str | None
    finish_reason: str | None = None
    think_balanced: bool | None = None
    mask_size: int | None = None  # exact loss tokens (tokenized input or measured with a tokenizer)
    conversation: tuple[list[dict[str, Any]], Any] | None = None  # (messages, tools) to render
    error: str | None = None  # the server refused the prompt (the completion record's `error`)


def is_tokenized_dataset(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and (path / "state.json").exists() and (path / "dataset_info.json").exists()


def _has_markers(*texts: str | None) -> bool:
    return any(t and (THINK_OPEN in t or THINK_CLOSE in t) for t in texts)


def sample_from_record(record: dict[str, Any], where: str) -> QCSample:
    """A completion record or a plain `{"messages": [...]}` record -> QCSample."""
    rid = str(record.get("id", where))
    source = str(record.get("source") or "")
    if "answer" in record or "reasoning" in record:
        reasoning, answer = record.get("reasoning") or "", record.get("answer") or ""
        return QCSample(rid, source, reasoning, answer, record.get("finish_reason"),
                        not _has_markers(reasoning, answer), None,
                        (completion_messages(record), record.get("tools")), record.get("error"))
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise QCInputError(
            f"{where}: neither a completion record (reasoning/answer keys) nor chat JSONL "
            '({"messages": [...]}); give the generate stage folder, chat JSONL or a tokenized dataset'
        )
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant":
        raise QCInputError(f"{where}: the last message is not an assistant turn; QC needs the response")
    content = last.get("content") or ""
    if last.get("reasoning_content") is not None:
        reasoning, answer = last["reasoning_content"], content
        balanced = not _has_markers(reasoning, answer)
    else:
        reasoning, answer, balanced = split_think(content)
    turn = {"role": "assistant", "content": answer, "reasoning_content": reasoning}
    return QCSample(rid, source, reasoning, answer, record.get("finish_reason"), balanced, None,
                    ([*messages[:-1], turn], record.get("tools")))


def iter_jsonl_samples(path: str | Path) -> Iterator[QCSample]:
    from dflashx.data.jsonl import shard_paths

    files = shard_paths(path)
    if not files:
        raise QCInputError(f"{path}: no JSONL shards (shard-*.jsonl) found")
    try:
        for file in files:
            for lineno, record in iter_numbered(file):
                yield sample_from_record(record, f"{file}:{lineno}")
    except JsonlLineError as e:
        raise QCInputError(str(e)) from e


def _last_run(mask: list[int]) -> tuple[int, int]:
    """[start, stop) of the last contiguous run of ones (the final assistant turn)."""
    stop = len(mask)
    while stop and not mask[stop - 1]:
        stop -= 1
    start = stop
    while start and mask[start - 1]:
        start -= 1
    return start, stop


def iter_tokenized_samples(path: str | Path, tokenizer: Any = None, batch_size: int = 512) -> Iterator[QCSample]:
    """Samples of a tokenized dataset; with a tokenizer, the last masked turn is decoded."""
    from datasets import load_from_disk

    ds = load_from_disk(str(path))
    missing = {"input_ids", "loss_mask"} - set(ds.column_names)
    if missing:
        raise QCInputError(f"{path}: a tokenized dataset needs columns input_ids and loss_mask; "
                           f"missing {sorted(missing)}")
    eot = getattr(tokenizer, "eos_token", None) or ""
    index = 0
    for batch in ds.iter(batch_size=batch_size):
        for j, (ids, mask) in enumerate(zip(batch["input_ids"], batch["loss_mask"])):
            rid = str(batch["id"][j]) if "id" in batch else str(index)
            source = str(batch["source"][j]) if "source" in batch else ""
            index += 1
            reasoning = answer = None
            balanced = None
            if tokenizer is not None:
                start, stop = _last_run(mask)
                text = tokenizer.decode(ids[start:stop], skip_special_tokens=False)
                text = text[: -len(eot)] if eot and text.endswith(eot) else text
                reasoning, answer, balanced = split_think(text)
            yield QCSample(rid, source, reasoning, answer, None, balanced, int(sum(mask)))


def iter_samples(path: str | Path, tokenizer: Any = None) -> Iterator[QCSample]:
    """Samples of any accepted input (see the module docstring)."""
    path = Path(path)
    if not path.exists():
        raise QCInputError(f"{path}: does not exist")
    if is_tokenized_dataset(path):
        return iter_tokenized_samples(path, tokenizer)
    return iter_jsonl_samples(path)
