"""A real S3 server for the storage tests: SeaweedFS `weed mini` on loopback.

`.ci/run` starts one with `.ci/start-s3.sh` and exports DFLASHX_TEST_S3_*; when those are absent
(plain `pytest`), the `s3_server` fixture runs the same script itself and stops the server at the
end of the session. Import the fixtures in a test module: `from s3_fixtures import s3_server, s3_env,
s3_spec`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from dflashx.config.schema import S3Spec

REPO_ROOT = Path(__file__).resolve().parents[1]
PART = 5 * 2**20


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str

    def client(self, secret: str | None = None):
        """A path-style client with the server's keys (or a wrong `secret`)."""
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=self.access_key,
                            aws_secret_access_key=secret or self.secret_key,
                            config=Config(s3={"addressing_style": "path"}))


def start_server(folder: Path) -> tuple[S3Server, int]:
    """Run .ci/start-s3.sh with its data in `folder`; the server and its process id."""
    env = {**os.environ, "DFLASHX_TEST_S3_DIR": str(folder)}
    out = subprocess.run(["bash", str(REPO_ROOT / ".ci" / "start-s3.sh")], env=env, text=True,
                         capture_output=True, timeout=120, check=False)
    if out.returncode != 0:
        raise RuntimeError(f".ci/start-s3.sh failed:\n{out.stderr}")
    found = dict(line.removeprefix("export ").split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    server = S3Server(found["DFLASHX_TEST_S3_ENDPOINT"], found["DFLASHX_TEST_S3_ACCESS_KEY"],
                      found["DFLASHX_TEST_S3_SECRET_KEY"])
    return server, int(found["DFLASHX_TEST_S3_PID"])


def stop_server(pid: int, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL if weed has not exited after `grace_s` (call before deleting its data)."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state == "Z":
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    if os.environ.get("DFLASHX_TEST_S3_ENDPOINT"):
        yield S3Server(os.environ["DFLASHX_TEST_S3_ENDPOINT"], os.environ["DFLASHX_TEST_S3_ACCESS_KEY"],
                       os.environ["DFLASHX_TEST_S3_SECRET_KEY"])
        return
    server, pid = start_server(tmp_path_factory.mktemp("weed"))
    try:
        yield server
    finally:
        stop_server(pid)


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> S3Server:
    """Credentials for the server in the environment only (as users give them), no ~/.aws files."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    return s3_server


@pytest.fixture
def s3_spec(s3_env: S3Server) -> S3Spec:
    """A fresh bucket for the test, path-style, 5 MiB parts, 2 parts at a time."""
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3_env.client().create_bucket(Bucket=bucket)
    return S3Spec(bucket=bucket, prefix="runs/", endpoint_url=s3_env.endpoint, region="us-east-1",
                  path_style=True, part_size=PART, max_concurrency=2)


def make_run(root: Path, s3: S3Spec | None = None, name: str = "tinyrun") -> Path:
    """A small finished run folder the way the orchestrator leaves it (real manifest, records,
    plan), with one artifact per tier and a superseded stage folder."""
    import yaml

    from dflashx.config.schema import STAGE_ORDER, Recipe
    from dflashx.plan.context import Estimates, totals
    from dflashx.plan.plan import Plan, StagePlan
    from dflashx.resolve import resolve
    from dflashx.run.keys import stage_key
    from dflashx.targets.registry import lookup
    from dflashx.run.rundir import RunDir
    from dflashx.store.manifest import Manifest, atomic_write_json
    from dflashx.track.records import RecordLog

    run = root / name
    (run / "ingest" / "prompts").mkdir(parents=True)
    for i in range(2):
        (run / "ingest" / "prompts" / f"shard-{i}.jsonl").write_text(f'{{"id": {i}}}\n' * (50 + i))
    (run / "train" / "checkpoint").mkdir(parents=True)
    (run / "train" / "checkpoint" / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (run / "train" / "train.log").write_text("step 1 loss 3.2\n")
    (run / "train" / "provenance.json").write_text('{"host": "test"}\n')
    (run / "generate.superseded-abcd1234" / "completions").mkdir(parents=True)
    (run / "generate.superseded-abcd1234" / "completions" / "c.jsonl").write_text("old\n" * 100)
    storage = {"root": str(root), "s3": s3.model_dump(mode="json") if s3 else None}
    (run / "recipe.yaml").write_text(yaml.safe_dump({"name": name, "storage": storage}))
    resolved = resolve(Recipe.model_validate({
        "name": name, "dataset": {"sources": [{"name": "p", "path": "p.jsonl"}]},
        "target": {"model": "builtin:tiny-qwen3"},
        "hardware": {"name": "cpu", "cpu_tflops": 0.1}, "storage": storage, "stages": {"backup": {"enabled": False}}}),
        lookup("builtin:tiny-qwen3"))
    atomic_write_json(run / "run.json", {"run_id": f"{name}-1", "recipe": name})
    planned = Estimates(seconds=100.0, storage_bytes=1000)  # every stage of the plan; these four with estimates
    stages = tuple(StagePlan(s, s != "backup" and s in ("ingest", "generate", "train"),
                             estimates=planned if s in ("ingest", "generate", "train", "backup") else Estimates())
                   for s in STAGE_ORDER)
    atomic_write_json(run / "plan.json", Plan((), stages, totals([s.estimates for s in stages]), resolved).to_json())
    log = RecordLog(run, f"{name}-1")
    log.append("run_start", argv=["dflashx", "run", "recipes/tiny.yaml"], stages=["ingest", "train"])
    log.append("stage_start", stage="ingest", stage_key="k1")
    log.append("stage_end", stage="ingest", stage_key="k1", duration_s=12.5, metrics={"prompts": 101})
    log.append("stage_start", stage="train", stage_key="k2")
    log.append("stage_end", stage="train", stage_key="k2", duration_s=80.0,
               metrics={"loss": 1.25, "tokens_per_s": 900.0})
    manifest = Manifest.load(run)
    manifest.register("ingest", "prompts", "ingest/prompts", "irreplaceable")
    manifest.register("train", "checkpoint", "train/checkpoint", "irreplaceable", ["ingest.prompts"])
    manifest.register("train", "logs", "train/train.log", "replaceable", regen_cost_usd=0.5)
    manifest.register("generate", "completions", "generate.superseded-abcd1234/completions", "garbage")
    manifest.save()
    for stage, seconds in (("ingest", 12.5), ("train", 80.0)):
        RunDir(run).mark_success(stage, stage_key(stage, resolved, manifest).key, seconds)
    return run
