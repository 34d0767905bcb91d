"""Preflight: check the world a recipe's run needs before its first stage (docs/running.md#preflight).

One `Check(name, status ok|warn|fail, detail, fix)` per question: sources, datasets ids, target config
and tokenizer, disk, S3, GPUs, attached servers. Each check runs in a thread under one deadline; an
exception becomes a `fail` naming the check. A builtin target is not built (minutes), only its tokenizer.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any, Literal

from dflashx.config.schema import STAGE_ORDER, GpuSpec, HardwareProfile, Recipe, S3Spec, SourceSpec, TargetSpec
from dflashx.data.formats import FormatError, to_prompt
from dflashx.data.sources import SourceError, iter_source, source_files
from dflashx.plan.explain import human_bytes
from dflashx.resolve.model import ResolvedRecipe
from dflashx.run.keys import stage_key
from dflashx.run.rundir import RunDir
from dflashx.store.manifest import Manifest
from dflashx.targets.resolve import builtin_identity, is_builtin, resolve_tokenizer_path

Status = Literal["ok", "warn", "fail"]
SAMPLE_RECORDS = 5  # first records of each local source parsed in its declared format
DEFAULT_TIMEOUT_S = 60.0
TARGET_STAGES = {"generate", "qc", "tokenize", "train", "eval", "export"}
GPU_STAGES = {"generate", "train", "eval"}
LOCAL, NOT_ON_HUB = "local folder", "not on the hub, or gated (set HF_TOKEN)"


@dataclass(frozen=True)
class Check:
    """One answer: `detail` names the recipe key it is about, `fix` what to do when not ok."""

    name: str
    status: Status
    detail: str
    fix: str = ""


def check_plan(plan: dict[str, Any]) -> Check:
    """The plan's own findings, as `dflashx plan` lists them (the first one here)."""
    findings = plan["errors"] or plan["warnings"]
    if not findings:
        return Check("plan", "ok", "no plan errors or warnings")
    first, kind = findings[0], "error" if plan["errors"] else "warning"
    return Check("plan", "fail" if plan["errors"] else "warn", f"{len(findings)} plan {kind}(s); first: "
                 f"{first['key']}: {first['message']}", first.get("fix") or "see `dflashx plan RECIPE`")


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
    except Exception as exc:  # no network, proxy, DNS: the local cache answers
        return f"hub unreachable: {type(exc).__name__}"


def _hub_dataset(name: str, key: str, hf_id: str) -> Check:
    where = _hub(hf_id, "dataset")
    if where == "hub":
        return Check(name, "ok", f"{key}: {hf_id} found on the hub")
    if where == NOT_ON_HUB:
        return Check(name, "fail", f"{key}: {hf_id} is {NOT_ON_HUB}", f"fix {key}, or log in for a gated dataset")
    home = Path(os.environ.get("HF_HOME", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "huggingface"))
    hub, sets = (Path(os.environ.get(f"HF_{v.upper()}_CACHE", home / v)) for v in ("hub", "datasets"))
    names = {"--".join(["datasets", *hf_id.split("/")]).lower(), "___".join(hf_id.split("/")).lower()}
    if any(p.name.lower() in names for d in (hub, sets) if d.is_dir() for p in d.iterdir()):  # any case
        return Check(name, "ok", f"{key}: {hf_id} in the local cache ({where})")
    return Check(name, "warn", f"{key}: {hf_id} not in the local cache ({where})",
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
        except Exception as exc:  # the hub went away meanwhile: the local cache may hold it
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
    if not is_builtin(spec.path) and not Path(spec.path).exists():
        return Check(name, "fail", f"{key}.path: {spec.path} does not exist",
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
        return Check(name, "fail", f"{key}.path: {exc}", f"point {key}.path at a .jsonl/.json/.parquet file or folder")
    where = f"{key}.path: {files[0]}" + (f" (+{len(files) - 1} files)" if len(files) > 1 else "")
    fix = f"set {key}.format (now {spec.format!r}) and {key}.fields to the file's layout, or fix the records"
    if not bad and not good:
        return Check(name, "fail", f"{where} holds no records", "add records, or remove the source")
    if bad:
        return Check(name, "warn" if good else "fail", f"{where}: {len(bad)} of the first {len(bad) + good} records "
                     f"do not parse as {spec.format}{' (ingest skips them)' if good else ''}; first: {bad[0]}", fix)
    return Check(name, "ok", f"{where}: the first {good} records parse as {spec.format}")


def check_target(target: TargetSpec, mask_id: int | None) -> Check:
    """A readable config.json (builtin targets: built on first use, not here) that fits the mask token."""
    from dflashx.targets.read_config import facts_from_config

    if is_builtin(target.model):
        return Check("target", "ok", f"target.model: {target.model} is built in, built on first use "
                     f"({builtin_identity(target.model)})")
    config, where = _target_file(target.model, "config.json")
    if config is None:
        return Check("target", "fail" if where in (LOCAL, NOT_ON_HUB) else "warn",
                     f"target.model: {target.model}: no config.json ({where})",
                     f"point target.model at a model folder, or download it first (`hf download {target.model}`)")
    facts = facts_from_config(json.loads(config.read_text(encoding="utf-8")), name=target.model)
    if mask_id is not None and mask_id >= facts.vocab_size:
        return Check("target", "fail", f"drafter.mask_token_id {mask_id} is outside the target's embedding "
                     f"(vocab_size {facts.vocab_size} in {config})", "set drafter.mask_token_id to a token of the target")
    return Check("target", "ok", f"target.model: {target.model}: config.json readable ({where}), "
                 f"{facts.num_layers} layers, vocab {facts.vocab_size}")


def _vocabulary(tokenizer_json: Path | None, folder: Path) -> dict[int, str]:
    """Token id -> token of a tokenizer.json (vocab + added tokens), else of AutoTokenizer(folder)."""
    if tokenizer_json is None:
        from transformers import AutoTokenizer

        return {i: t for t, i in AutoTokenizer.from_pretrained(str(folder)).get_vocab().items()}
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    vocab = data.get("model", {}).get("vocab") or {}
    ids = {i: str(t[0]) for i, t in enumerate(vocab)} if isinstance(vocab, list) else {int(i): t for t, i in vocab.items()}
    ids.update({int(t["id"]): str(t["content"]) for t in data.get("added_tokens") or []})
    return ids


def check_tokenizer(target: TargetSpec, mask_id: int | None) -> Check:
    """The tokenizer loads and its vocabulary holds `mask_token_id` (a builtin's is made in seconds)."""
    key = "target.tokenizer" if target.tokenizer else "target.model"
    label, folder = f"{key} {target.tokenizer or target.model}", resolve_tokenizer_path(target)
    path, where = _target_file(str(folder), "tokenizer.json")
    if path is None and not folder.is_dir():
        return Check("tokenizer", "fail" if where == NOT_ON_HUB else "warn",
                     f"{label}: tokenizer.json not found ({where}); not checked",
                     f"download the tokenizer first (`hf download {folder}`) or point {key} at a local folder")
    vocab = _vocabulary(path, folder)
    if mask_id is None:
        return Check("tokenizer", "ok", f"{label}: tokenizer readable ({len(vocab)} tokens, {where})")
    if mask_id not in vocab:
        return Check("tokenizer", "fail", f"drafter.mask_token_id {mask_id} is not in the tokenizer of {label} "
                     f"({len(vocab)} tokens, ids up to {max(vocab, default=-1)})",
                     "set drafter.mask_token_id to a token of this tokenizer (e.g. an added `<|mask|>`)")
    return Check("tokenizer", "ok", f"{label}: tokenizer readable ({where}); mask_token_id {mask_id} is {vocab[mask_id]!r}")


def check_disk(root: str, plan: dict[str, Any], run_dir: Path) -> Check:
    """Free space at storage.root covers the plan's storage, less what the run already holds."""
    planned = float(plan["totals"].get("storage_bytes", 0.0))
    held = sum(e.size for e in Manifest.load(run_dir).live()) if (run_dir / "manifest.json").is_file() else 0
    probe = Path(root).absolute()
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    detail = (f"storage.root: {root} ({probe}: {human_bytes(free)} free); the plan stores {human_bytes(planned)}"
              + (f", {human_bytes(held)} of it already in {run_dir}" if held else ""))
    if free < planned - held:
        return Check("disk", "fail", detail, "free space there, point storage.root at a bigger disk, or plan "
                     "less storage (`dflashx plan` shows it per stage)")
    return Check("disk", "ok", detail)


def _s3_code(exc: BaseException) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def _s3_fail(exc: Exception, spec: S3Spec, endpoint: str) -> Check:
    from botocore.exceptions import NoCredentialsError

    cause = exc.__cause__ if exc.__cause__ is not None else exc
    if (code := _s3_code(cause)) in ("404", "NoSuchBucket"):
        return Check("s3", "fail", f"storage.s3.bucket: bucket {spec.bucket!r} does not exist at {endpoint}",
                     "create the bucket, or fix storage.s3.bucket")
    if isinstance(cause, NoCredentialsError) or code in ("InvalidAccessKeyId", "SignatureDoesNotMatch"):
        fix = (f"set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) to keys valid for {endpoint}, "
               "or name a profile in storage.s3.aws_profile")
    elif code in ("403", "AccessDenied"):
        fix = f"grant these credentials s3:ListBucket/PutObject/GetObject/DeleteObject on {spec.bucket}/{spec.prefix}"
    else:
        fix = "check storage.s3.endpoint_url, storage.s3.region and the network"
    return Check("s3", "fail", f"storage.s3 (bucket {spec.bucket!r} at {endpoint}): {exc}", fix)


def check_s3(spec: S3Spec, run_name: str) -> Check:
    """Head the bucket, then put (read back and verified by the store) and delete one probe object."""
    from botocore.exceptions import BotoCoreError, ClientError

    from dflashx.store.base import StoreError
    from dflashx.store.s3 import S3Store

    endpoint = spec.endpoint_url or "the default AWS endpoint"
    key = f"{run_name}/.preflight-{uuid.uuid4().hex[:12]}"
    with tempfile.TemporaryDirectory(prefix="dflashx-preflight-") as tmp:
        try:
            store = S3Store(spec, Path(tmp), max_attempts=2)
            try:
                store.client.head_bucket(Bucket=spec.bucket)
            except (ClientError, BotoCoreError) as exc:
                if _s3_code(exc) in ("404", "NoSuchBucket"):
                    return _s3_fail(exc, spec, endpoint)
                store.check_access()  # a HEAD has no error body: the listing says which error it is
            (probe := Path(tmp) / "probe").write_text(f"dflashx preflight {time.time()}\n")
            store.put(probe, key)
            store.delete(key)
        except (StoreError, ClientError, BotoCoreError) as exc:
            return _s3_fail(exc, spec, endpoint)
    return Check("s3", "ok", f"storage.s3: put, read back and deleted {store.uri(key)}")


def _fits(gpu: GpuSpec, device: tuple[str, int]) -> tuple[bool, bool]:
    """(the device is that model: every word of its name; it has that memory, within 5%)."""
    return all(w in device[0].lower() for w in gpu.name.lower().split()), device[1] >= 0.95 * gpu.memory_gb * 1e9


def _profiles_for(found: list[tuple[str, int]]) -> str:
    """`hardware=NAME` choices whose GPUs this machine has, for the fix line."""
    from dflashx.config.load import available_profiles, load_profile

    names = []
    for name in available_profiles():
        try:
            p = load_profile(name)
        except Exception:  # a broken profile file is `dflashx profiles`' business, not this check's
            continue
        if (p.gpu is None and not found) or (p.gpu and found and p.gpus_per_node <= len(found)
                                              and all(all(_fits(p.gpu, d)) for d in found)):
            names.append(f"hardware={name}")
    return " or ".join(names) or "a profile of this machine (see `dflashx profiles`)"


def check_gpus(hw: HardwareProfile, plan: dict[str, Any]) -> Check:
    """This machine's GPUs (count, model, memory) against the hardware profile the plan assumed."""
    if hw.gpu is None:
        return Check("gpus", "ok", f"hardware: profile {hw.name} runs on the CPU")
    import torch  # a dependency; asked only for a GPU profile (the import takes seconds)

    found = [(p.name, int(p.total_memory)) for p in map(torch.cuda.get_device_properties, range(torch.cuda.device_count()))]
    have = ", ".join(f"{n}x {name} ({human_bytes(mem)})" for (name, mem), n in Counter(found).items()) or "no GPU"
    gpu, peak = hw.gpu, plan["totals"].get("peak_gpu_memory_bytes", 0)
    needs = (f"hardware: the plan (profile {hw.name}) needs {hw.gpus_per_node}x {gpu.name} with {gpu.memory_gb:g} GB "
             f"each (peak use {human_bytes(peak)}/GPU); this machine has {have}")
    fix = f"run on the profile's hardware, or plan for this machine: {_profiles_for(found)}"
    if len(found) < hw.gpus_per_node:
        return Check("gpus", "fail", f"{needs}: profile {hw.name} wants {hw.gpus_per_node} GPUs, found {len(found)}", fix)
    if small := [d for d in found if not _fits(gpu, d)[1]]:
        return Check("gpus", "fail", f"{needs}: {len(small)} GPU(s) have less memory than the profile", fix)
    if not all(_fits(gpu, d)[0] for d in found):
        return Check("gpus", "warn", f"{needs}: another GPU model; speed estimates assume {gpu.name}", fix)
    return Check("gpus", "ok", f"hardware: {have} match profile {hw.name}")


def check_server(index: int, url: str, model: str) -> Check:
    """An attached server answers `/health` and `/v1/models` (and serves the target, by name)."""
    import httpx

    from dflashx.backends.servers import base_url

    name, key, base = f"server {index}", f"stages.generate.urls[{index}]", base_url(url)
    fix = f"start the server (`dflashx plan` lists its command), or fix or remove {key}"
    try:
        with httpx.Client(timeout=5.0) as client:
            health, models = client.get(f"{base}/health"), client.get(f"{base}/v1/models")
            served = [str(m["id"]) for m in models.json()["data"]] if models.status_code == 200 else []
    except httpx.HTTPError as exc:
        return Check(name, "fail", f"{key}: {base} does not answer: {type(exc).__name__}: {exc}", fix)
    except (ValueError, KeyError, TypeError):  # not JSON, or not the OpenAI model list
        served = []
    if health.status_code != 200:
        return Check(name, "warn" if health.status_code == 503 else "fail",
                     f"{key}: {base}/health answers HTTP {health.status_code} (503: still starting; generate "
                     "waits stages.generate.server_startup_timeout_s)", fix)
    if not served:
        return Check(name, "fail", f"{key}: {base}/v1/models answers HTTP {models.status_code} "
                     "without a model list: not an OpenAI-compatible server?", fix)
    detail = f"{key}: {base} healthy, serves {', '.join(served)}"
    if not any(Path(model).name.lower() in m.lower() for m in served):
        return Check(name, "warn", f"{detail}, not target.model {model}",
                     "check that it serves the target (the completions come from whatever it serves)")
    return Check(name, "ok", detail)


def stages_to_check(recipe: Recipe, run_dir: Path, stages: Sequence[str], force: Iterable[str] = ()) -> list[str]:
    """`stages` less those a run would skip as done (their `_SUCCESS` holds the current key)."""
    if not isinstance(recipe, ResolvedRecipe) or not (Path(run_dir) / "manifest.json").is_file():
        return list(stages)
    try:
        manifest, rundir = Manifest.load(run_dir), RunDir(Path(run_dir))
        return [s for s in stages if s in force or not (done := rundir.success(s))
                or done.get("stage_key") != stage_key(s, recipe, manifest).key]
    except (OSError, ValueError, KeyError):
        return list(stages)


def _bounded(jobs: list[tuple[str, Callable[[], Check], Status]], timeout_s: float) -> list[Check]:
    """Each job in a daemon thread; past the deadline a job gets its slow status, an exception a fail."""
    results: list[Check | None] = [None] * len(jobs)

    def work(i: int, name: str, fn: Callable[[], Check]) -> None:
        try:
            results[i] = fn()
        except Exception as exc:
            results[i] = Check(name, "fail", f"{name}: the check failed: {type(exc).__name__}: {exc}",
                               "fix the cause above; `dflashx run --skip-preflight` runs without the preflight")

    threads = [threading.Thread(target=work, args=(i, name, fn), daemon=True) for i, (name, fn, _) in enumerate(jobs)]
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [r if r is not None else Check(name, slow, f"{name}: no answer within {timeout_s:g} s",
                                          "check the network and the endpoint, then retry")
            for r, (name, _, slow) in zip(list(results), jobs)]


def preflight(recipe: Recipe, plan: dict[str, Any], run_dir: Path, stages: Sequence[str] = STAGE_ORDER,
              timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Check]:
    """The checks the enabled `stages` need, in order (the plan's own errors: `check_plan`). Pass the
    plan's `ResolvedRecipe` when it has one (its mask token is checked), else the `Recipe`."""
    wanted = set(stages) & {s for s in STAGE_ORDER if getattr(recipe.stages, s).enabled}
    mask_id = getattr(recipe.drafter, "mask_token_id", None)
    jobs: list[tuple[str, Callable[[], Check], Status]] = []
    if "ingest" in wanted:
        jobs += [(f"source {s.name}", partial(check_source, i, s), "warn") for i, s in enumerate(recipe.dataset.sources)]
    if wanted & TARGET_STAGES:
        jobs += [("target", partial(check_target, recipe.target, mask_id), "warn"),
                 ("tokenizer", partial(check_tokenizer, recipe.target, mask_id), "warn")]
    jobs.append(("disk", partial(check_disk, recipe.storage.root, plan, Path(run_dir)), "fail"))
    if "backup" in wanted and recipe.storage.s3 is not None:
        jobs.append(("s3", partial(check_s3, recipe.storage.s3, recipe.name), "fail"))
    if wanted & GPU_STAGES:
        jobs.append(("gpus", partial(check_gpus, recipe.hardware, plan), "fail"))
    if "generate" in wanted and recipe.stages.generate.backend == "sglang":
        jobs += [(f"server {i}", partial(check_server, i, u, recipe.target.model), "fail")
                 for i, u in enumerate(recipe.stages.generate.urls)]
    return _bounded(jobs, timeout_s)
