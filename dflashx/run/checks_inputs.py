"""Preflight checks of what a recipe reads: its dataset sources (local files parsed in their declared
format, hub ids looked up), the target's config and its tokenizer (with the drafter's mask token).
A builtin target is not built (minutes), only its tokenizer read."""

from __future__ import annotations

import json
import os
from itertools import islice
from pathlib import Path

from dflashx.config.schema import SourceSpec, TargetSpec
from dflashx.data.formats import FormatError, to_prompt
from dflashx.data.sources import SourceError, iter_source, source_files
from dflashx.run.check import Check
from dflashx.targets.load import tokenizer_from
from dflashx.targets.locate import builtin_identity, is_builtin, locate_tokenizer
from dflashx.targets.read_config import facts_from_config

SAMPLE_RECORDS = 5  # first records of each local source parsed in its declared format
LOCAL, NOT_ON_HUB = "local folder", "not on the hub, or gated (set HF_TOKEN)"


def _offline() -> bool:
    return any(os.environ.get(var, "").lower() in ("1", "true", "yes", "on")
               for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _hub(repo_id: str, repo_type: str) -> str:
    """"hub" when the hub knows the repo, NOT_ON_HUB, or why the local cache has to answer instead."""
    if _offline():
        return "offline"
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    try:
        HfApi().repo_info(repo_id, repo_type=repo_type, timeout=10)
        return "hub"
    except RepositoryNotFoundError:
        return NOT_ON_HUB
    except Exception as exc:  # noqa: BLE001 - no network, proxy, DNS: the local cache answers
        return f"hub unreachable: {type(exc).__name__}"


def _hub_dataset(name: str, key: str, hf_id: str) -> Check:
    where = _hub(hf_id, "dataset")
    if where == "hub":
        return Check(name, key, "ok", f"{key}: {hf_id} found on the hub")
    if where == NOT_ON_HUB:
        return Check(name, key, "fail", f"{key}: {hf_id} is {NOT_ON_HUB}", f"fix {key}, or log in for a gated dataset")
    home = Path(os.environ.get("HF_HOME",
                               Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "huggingface"))
    hub, sets = (Path(os.environ.get(f"HF_{v.upper()}_CACHE", home / v)) for v in ("hub", "datasets"))
    names = {"--".join(["datasets", *hf_id.split("/")]).lower(), "___".join(hf_id.split("/")).lower()}
    if any(p.name.lower() in names for d in (hub, sets) if d.is_dir() for p in d.iterdir()):  # any case
        return Check(name, key, "ok", f"{key}: {hf_id} in the local cache ({where})")
    return Check(name, key, "warn", f"{key}: {hf_id} not in the local cache ({where})",
                 "run where the hub is reachable, or download it and use `path:` with a local JSONL/Parquet file")


def _target_file(value: str, filename: str) -> tuple[Path | None, str]:
    """`filename` of a local folder or hub id (downloaded, else from the cache), and where it came from."""
    if Path(value).is_dir():
        path = Path(value) / filename
        return (path if path.is_file() else None), LOCAL
    where = _hub(value, "model")
    if where == "hub":
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import RemoteEntryNotFoundError

        try:
            return Path(hf_hub_download(value, filename, etag_timeout=10)), where
        except RemoteEntryNotFoundError:
            return None, f"the hub repository has no {filename}"
        except Exception as exc:  # noqa: BLE001 - the hub went away meanwhile: the local cache may hold it
            where = f"hub unreachable: {type(exc).__name__}"
    if where == NOT_ON_HUB:
        return None, where
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(value, filename)
    return (Path(cached) if isinstance(cached, str) else None), f"local cache, {where}"


def check_source(index: int, spec: SourceSpec) -> Check:
    """A local source exists and its first records parse in its format; a hub id resolves."""
    name, key = f"source {spec.name}", f"dataset.sources[{index}]"
    if spec.hf_id is not None:
        return _hub_dataset(name, f"{key}.hf_id", spec.hf_id)
    assert spec.path is not None
    path_key = f"{key}.path"
    if not is_builtin(spec.path) and not Path(spec.path).exists():
        return Check(name, path_key, "fail", f"{path_key}: {spec.path} does not exist",
                     f"create it (copy the data here), fix {key}.path, or remove the source")
    bad, good = [], 0
    try:
        files = source_files(spec)
        for raw in islice(iter_source(spec), SAMPLE_RECORDS):
            try:
                if raw.error:
                    raise FormatError(raw.error)
                to_prompt(raw.data, spec.format, spec.fields, spec.system_prompt)
                good += 1
            except FormatError as exc:
                bad.append(f"{raw.where}: {exc}")
    except SourceError as exc:
        return Check(name, path_key, "fail", f"{path_key}: {exc}",
                     f"point {path_key} at a .jsonl/.json/.parquet file or folder")
    where = f"{path_key}: {files[0]}" + (f" (+{len(files) - 1} files)" if len(files) > 1 else "")
    fix = f"set {key}.format (now {spec.format!r}) and {key}.fields to the file's layout, or fix the records"
    if not bad and not good:
        return Check(name, path_key, "fail", f"{where} holds no records", "add records, or remove the source")
    if bad:
        return Check(name, path_key, "warn" if good else "fail",
                     f"{where}: {len(bad)} of the first {len(bad) + good} records do not parse as "
                     f"{spec.format}{' (ingest skips them)' if good else ''}; first: {bad[0]}", fix)
    return Check(name, path_key, "ok", f"{where}: the first {good} records parse as {spec.format}")


def check_target(target: TargetSpec, mask_id: int | None) -> Check:
    """A readable config.json (builtin targets: built on first use, not here) that fits the mask token."""

    if is_builtin(target.model):
        return Check("target", "target.model", "ok", f"target.model: {target.model} is built in, built on first use "
                     f"({builtin_identity(target.model)})")
    config, where = _target_file(target.model, "config.json")
    if config is None:
        return Check("target", "target.model", "fail" if where in (LOCAL, NOT_ON_HUB) else "warn",
                     f"target.model: {target.model}: no config.json ({where})",
                     f"point target.model at a model folder, or download it first (`hf download {target.model}`)")
    facts = facts_from_config(json.loads(config.read_text(encoding="utf-8")), name=target.model)
    if mask_id is not None and mask_id >= facts.vocab_size:
        return Check("target", "drafter.mask_token_id", "fail",
                     f"drafter.mask_token_id {mask_id} is outside the target's embedding "
                     f"(vocab_size {facts.vocab_size} in {config})",
                     "set drafter.mask_token_id to a token of the target")
    return Check("target", "target.model", "ok", f"target.model: {target.model}: config.json readable ({where}), "
                 f"{facts.num_layers} layers, vocab {facts.vocab_size}")


def _vocabulary(tokenizer_json: Path | None, folder: Path) -> dict[int, str]:
    """Token id -> token of a tokenizer.json (vocab + added tokens), else of AutoTokenizer(folder)."""
    if tokenizer_json is None:

        return {i: t for t, i in tokenizer_from(folder).get_vocab().items()}
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    vocab = data.get("model", {}).get("vocab") or {}
    ids = {i: str(t[0]) for i, t in enumerate(vocab)} if isinstance(vocab,
                                                                    list) else {int(i): t for t, i in vocab.items()}
    ids.update({int(t["id"]): str(t["content"]) for t in data.get("added_tokens") or []})
    return ids


def check_tokenizer(target: TargetSpec, mask_id: int | None) -> Check:
    """The tokenizer loads and its vocabulary holds `mask_token_id` (a builtin's is made in seconds)."""
    key = "target.tokenizer" if target.tokenizer else "target.model"
    label, folder = f"{key} {target.tokenizer or target.model}", locate_tokenizer(target)
    path, where = _target_file(str(folder), "tokenizer.json")
    if path is None and not folder.is_dir():
        return Check("tokenizer", key, "fail" if where == NOT_ON_HUB else "warn",
                     f"{label}: tokenizer.json not found ({where}); not checked",
                     f"download the tokenizer first (`hf download {folder}`) or point {key} at a local folder")
    vocab = _vocabulary(path, folder)
    if mask_id is None:
        return Check("tokenizer", key, "ok", f"{label}: tokenizer readable ({len(vocab)} tokens, {where})")
    if mask_id not in vocab:
        return Check("tokenizer", "drafter.mask_token_id", "fail",
                     f"drafter.mask_token_id {mask_id} is not in the tokenizer of {label} "
                     f"({len(vocab)} tokens, ids up to {max(vocab, default=-1)})",
                     "set drafter.mask_token_id to a token of this tokenizer (e.g. an added `<|mask|>`)")
    return Check("tokenizer", key, "ok",
                 f"{label}: tokenizer readable ({where}); mask_token_id {mask_id} is {vocab[mask_id]!r}")
