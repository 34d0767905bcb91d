"""An eval suite's prompts: the records of its file or `datasets` id, as prompt records.

`suite_prompts(suite, heldout_file)` returns `[{"id", "source", "messages", "tools"?}]`:

- the held-out suite (`ResolvedSuite.heldout`) reads `heldout_file`, a JSONL of `{id, messages,
  source?, tools?}` (`stages.eval.prompts`, or the ingest stage's `eval_prompts.jsonl`): its first
  `count` records (`load_prompts`);
- a file or `datasets` suite reads its records with the reader `dataset.sources` use
  (`dflashx.data.sources.iter_source`: JSONL/JSON/Parquet files or folders, `builtin:` files, or
  `datasets.load_dataset(hf_id, hf_config, split=split, streaming=True)`). Its `template` writes
  the one user turn from the record's fields; without one the record becomes a prompt as a source
  record does (`dflashx.data.formats.to_prompt` with its `format` and `fields`).

Which records: the first `count`, or with `sample_seed` the record order shuffled by
`random.Random(sample_seed)` and then its first `count`, which is how the z-lab benchmark script
picks its prompts (PyPI `dflash` 0.1.0, `dflash/benchmark.py`, `_select_dataset`). A prompt's id is
the record's `id` when it has one, else `<suite>#<index in the source>`; its source is the record's
`source`, else the suite's name. Errors name the recipe item (`stages.eval.suites[<name>]`), the
record and the fix.
"""

from __future__ import annotations

import random
from itertools import islice
from pathlib import Path
from typing import Any

from dflashx.config.eval_suites import template_fields
from dflashx.config.schema import SourceSpec
from dflashx.data.formats import FormatError, to_prompt
from dflashx.data.jsonl import iter_numbered
from dflashx.data.sources import RawRecord, iter_source
from dflashx.resolve.model import ResolvedSuite


def suite_key(suite: ResolvedSuite) -> str:
    """The recipe item that defines `suite`, as errors name it."""
    return f"stages.eval.suites[{suite.name}]"


def load_prompts(path: Path, limit: int) -> list[dict[str, Any]]:
    """The first `limit` prompt records of a JSONL file, each checked for `messages`."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: eval prompts file not found (stages.eval.prompts)")
    out = []
    for line_no, record in iter_numbered(path):
        if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
            raise ValueError(  # noqa: TRY004 - bad file content, not a bad argument type
                f"{path}:{line_no}: key `messages` missing; expected {{\"id\", \"messages\": [...]}}"
            )
        out.append(record)
        if len(out) == limit:
            break
    if not out:
        raise ValueError(f"{path}: no prompts; the eval stage needs at least one")
    return out


def _selected(suite: ResolvedSuite) -> list[tuple[int, RawRecord]]:
    """(index in the source, record) of the records the suite decodes, in decoding order."""
    spec = SourceSpec(name=suite.name, path=suite.path, hf_id=suite.hf_id, hf_config=suite.hf_config,
                      split=suite.split, format=suite.format, fields=suite.fields)
    stream = enumerate(iter_source(spec, suite_key(suite)))
    if suite.sample_seed is None:
        return list(islice(stream, suite.count))
    rows = list(stream)
    order = list(range(len(rows)))
    random.Random(suite.sample_seed).shuffle(order)
    return [rows[i] for i in order[: suite.count]]


def _from_template(template: str, record: dict[str, Any]) -> dict[str, Any]:
    empty = [f for f in template_fields(template) if record.get(f.split("[")[0]) in (None, "", [])]
    if empty:  # absent, or null as Parquet and `datasets` write a missing value
        raise FormatError(f"template {template!r} cannot read {empty[0].split('[')[0]!r}: the record has no value "
                          f"there (fields with values: {sorted(k for k, v in record.items() if v not in (None, ''))})")
    try:
        text = template.format_map(record)
    except (KeyError, IndexError, TypeError) as exc:
        raise FormatError(f"template {template!r} cannot read {exc} from the record (fields: {sorted(record)}); "
                          "name fields the records have") from None
    if not text.strip():
        raise FormatError(f"template {template!r} wrote an empty user turn")
    return {"messages": [{"role": "user", "content": text}]}


def _prompt(suite: ResolvedSuite, index: int, raw: RawRecord) -> dict[str, Any]:
    fix = f"fix the record or {suite_key(suite)}'s template / format / fields"
    if raw.error is not None:
        raise ValueError(f"{raw.where}: {raw.error} ({fix})")
    record = raw.data
    try:
        if not isinstance(record, dict):
            raise FormatError(f"expected a JSON object, got {type(record).__name__}")
        prompt = _from_template(suite.template, record) if suite.template else to_prompt(record, suite.format,
                                                                                          suite.fields)
    except FormatError as exc:
        raise ValueError(f"{raw.where}: {exc} ({fix})") from None
    given = record.get("id")
    return {"id": f"{suite.name}#{index}" if given in (None, "") else str(given),
            "source": str(record.get("source") or suite.name), **prompt}


def suite_prompts(suite: ResolvedSuite, heldout_file: Path | None) -> list[dict[str, Any]]:
    """The prompt records `suite` decodes (see the module docstring)."""
    if suite.heldout:
        if heldout_file is None:
            raise ValueError(
                "eval stage has no held-out prompts for the `heldout` suite: set stages.eval.prompts (a JSONL of "
                "{id, messages}), keep dataset.eval_holdout > 0 so the ingest stage writes eval_prompts.jsonl, "
                "or drop `heldout` from stages.eval.suites"
            )
        return load_prompts(heldout_file, suite.count)
    prompts = [_prompt(suite, index, raw) for index, raw in _selected(suite)]
    if not prompts:
        raise ValueError(f"{suite_key(suite)}: no records in {suite.path or suite.hf_id} (split {suite.split!r}); "
                         "point it at a file or split that has some")
    return prompts
