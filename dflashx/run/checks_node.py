"""Preflight checks of the node and the services a run uses: free disk for the plan's storage, the S3
bucket (a write, read and delete probe), the GPUs against the profile, and attached servers."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from dflashx.backends.servers import base_url
from dflashx.config.gpus import gpu_model, match_gpu
from dflashx.config.load import available_profiles, load_profile
from dflashx.config.schema import GpuSpec, HardwareProfile, S3Spec
from dflashx.plan.context import Totals
from dflashx.plan.explain import human_bytes
from dflashx.run.check import Check
from dflashx.store.base import StoreError
from dflashx.store.manifest import Manifest


def check_disk(root: str, totals: Totals, run_dir: Path) -> Check:
    """Free space at storage.root covers the plan's storage (its `totals`), less what the run already holds."""
    planned = totals.storage_bytes
    held = sum(e.size for e in Manifest.load(run_dir).live()) if (run_dir / "manifest.json").is_file() else 0
    probe = Path(root).absolute()
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    detail = (f"storage.root: {root} ({probe}: {human_bytes(free)} free); the plan stores {human_bytes(planned)}"
              + (f", {human_bytes(held)} of it already in {run_dir}" if held else ""))
    if free < planned - held:
        return Check("disk", "storage.root", "fail", detail, "free space there, point storage.root at a bigger "
                     "disk, or plan less storage (`dflashx plan` shows it per stage)")
    return Check("disk", "storage.root", "ok", detail)


def _s3_code(exc: BaseException) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def _s3_fail(exc: Exception, spec: S3Spec, endpoint: str) -> Check:
    from botocore.exceptions import NoCredentialsError

    cause = exc.__cause__ if exc.__cause__ is not None else exc
    if (code := _s3_code(cause)) in ("404", "NoSuchBucket"):
        return Check("s3", "storage.s3.bucket", "fail",
                     f"storage.s3.bucket: bucket {spec.bucket!r} does not exist at {endpoint}",
                     "create the bucket, or fix storage.s3.bucket")
    if isinstance(cause, NoCredentialsError) or code in ("InvalidAccessKeyId", "SignatureDoesNotMatch"):
        fix = (f"set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) to keys valid for {endpoint}, "
               "or name a profile in storage.s3.aws_profile")
    elif code in ("403", "AccessDenied"):
        fix = f"grant these credentials s3:ListBucket/PutObject/GetObject/DeleteObject on {spec.bucket}/{spec.prefix}"
    else:
        fix = "check storage.s3.endpoint_url, storage.s3.region and the network"
    return Check("s3", "storage.s3", "fail", f"storage.s3 (bucket {spec.bucket!r} at {endpoint}): {exc}", fix)


def check_s3(spec: S3Spec, run_name: str) -> Check:
    """Head the bucket, then put (read back and verified by the store) and delete one probe object."""
    from botocore.exceptions import BotoCoreError, ClientError

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
    return Check("s3", "storage.s3", "ok", f"storage.s3: put, read back and deleted {store.uri(key)}")


def _fits(gpu: GpuSpec, device: tuple[str, int]) -> tuple[bool, bool]:
    """(the device is that model: the GPU table's row the driver's name matches, or for a GPU the table lacks
    every word of its name; it has that memory, within 5%: torch reports a little less than nvidia-smi)."""
    model = gpu_model(gpu.name)
    same = match_gpu(device[0]) is model if model is not None else \
        all(w in device[0].lower() for w in gpu.name.lower().split())
    return same, device[1] >= 0.95 * gpu.memory_gb * 1e9


def _profiles_for(found: list[tuple[str, int]]) -> str:
    """`hardware=NAME` choices whose GPUs this machine has, for the fix line."""

    names = []
    for name in available_profiles():
        try:
            p = load_profile(name)
        except Exception:  # noqa: BLE001 - a broken profile file is `dflashx profiles`' business, not this check's
            continue
        if (p.gpu is None and not found) or (p.gpu and found and p.gpus_per_node <= len(found)
                                              and all(all(_fits(p.gpu, d)) for d in found)):
            names.append(f"hardware={name}")
    return " or ".join([*names, "hardware=local (this machine, detected: `dflashx profiles --show local`)"])


def check_gpus(hw: HardwareProfile, totals: Totals) -> Check:
    """This machine's GPUs (count, model, memory) against the hardware profile the plan (its `totals`) assumed."""
    if hw.gpu is None:
        return Check("gpus", "hardware", "ok", f"hardware: profile {hw.name} runs on the CPU")
    import torch  # a dependency; asked only for a GPU profile (the import takes seconds)

    found = [(p.name, int(p.total_memory)) for p in map(torch.cuda.get_device_properties,
                                                        range(torch.cuda.device_count()))]
    have = ", ".join(f"{n}x {name} ({human_bytes(mem)})" for (name, mem), n in Counter(found).items()) or "no GPU"
    gpu, peak = hw.gpu, totals.peak_gpu_memory_bytes
    needs = (f"hardware: the plan (profile {hw.name}) needs {hw.gpus_per_node}x {gpu.name} with {gpu.memory_gb:g} GB "
             f"each (peak use {human_bytes(peak)}/GPU); this machine has {have}")
    fix = f"run on the profile's hardware, or plan for this machine: {_profiles_for(found)}"
    if len(found) < hw.gpus_per_node:
        return Check("gpus", "hardware", "fail",
                     f"{needs}: profile {hw.name} wants {hw.gpus_per_node} GPUs, found {len(found)}", fix)
    if small := [d for d in found if not _fits(gpu, d)[1]]:
        return Check("gpus", "hardware", "fail", f"{needs}: {len(small)} GPU(s) have less memory than the profile", fix)
    if not all(_fits(gpu, d)[0] for d in found):
        return Check("gpus", "hardware", "warn", f"{needs}: another GPU model; speed estimates assume {gpu.name}", fix)
    return Check("gpus", "hardware", "ok", f"hardware: {have} match profile {hw.name}")


def check_server(index: int, url: str, model: str) -> Check:
    """An attached server answers `/health` and `/v1/models` (and serves the target, by name)."""
    import httpx


    name, key, base = f"server {index}", f"stages.generate.urls[{index}]", base_url(url)
    fix = f"start the server (`dflashx plan` lists its command), or fix or remove {key}"
    try:
        with httpx.Client(timeout=5.0) as client:
            health, models = client.get(f"{base}/health"), client.get(f"{base}/v1/models")
            served = [str(m["id"]) for m in models.json()["data"]] if models.status_code == 200 else []
    except httpx.HTTPError as exc:
        return Check(name, key, "fail", f"{key}: {base} does not answer: {type(exc).__name__}: {exc}", fix)
    except (ValueError, KeyError, TypeError):  # not JSON, or not the OpenAI model list
        served = []
    if health.status_code != 200:
        return Check(name, key, "warn" if health.status_code == 503 else "fail",
                     f"{key}: {base}/health answers HTTP {health.status_code} (503: still starting; generate "
                     "waits stages.generate.server_startup_timeout_s)", fix)
    if not served:
        return Check(name, key, "fail", f"{key}: {base}/v1/models answers HTTP {models.status_code} "
                     "without a model list: not an OpenAI-compatible server?", fix)
    detail = f"{key}: {base} healthy, serves {', '.join(served)}"
    if not any(Path(model).name.lower() in m.lower() for m in served):
        return Check(name, key, "warn", f"{detail}, not target.model {model}",
                     "check that it serves the target (the completions come from whatever it serves)")
    return Check(name, key, "ok", detail)
