"""`dflashx preflight` and the preflight `dflashx run` does first (the S3 probe: test_preflight_s3.py).

Everything runs for real here (files, tokenizers, a local OpenAI-compatible HTTP server, the disk)
except GPUs: the tests that need GPUs monkeypatch `torch.cuda.device_count` / `get_device_properties`
to simulate them, and say so.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import test_run_fakes as fakes
import torch
from openai_server import Script, ScriptedOpenAIServer
from typer.testing import CliRunner

from dflashx.cli.main import app
from dflashx.config.load import load_profile
from dflashx.config.schema import SourceSpec, TargetSpec
from dflashx.plan.context import Totals
from dflashx.run import orchestrator
from dflashx.run import preflight as pf

REPO = Path(__file__).resolve().parents[1]
GiB = 2**30


def _cli(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})  # table cells unwrapped


def _simulate_gpus(monkeypatch, n: int, name: str = "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                   memory: int = 97_887 * 2**20) -> None:
    """Simulated GPUs: this test machine has none, so torch.cuda answers what a GPU node would."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(name=name, total_memory=memory))


@pytest.fixture
def no_aws(monkeypatch, tmp_path):
    """No AWS credentials anywhere (and no instance metadata lookups), so the S3 probe stops at once."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "DFLASHX_S3_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


# --------------------------------------------------------------------------- the acceptance


def test_seed_recipe_on_a_cpu_machine_fails_on_gpus_and_the_missing_source(monkeypatch, no_aws):
    _simulate_gpus(monkeypatch, 0)  # what this CPU machine has anyway; fixed so a GPU host gives the same
    result = _cli("preflight", str(REPO / "recipes" / "qwen36_27b.yaml"))
    out = result.output
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    assert "profile rtx_pro_6000_x4 wants 4 GPUs, found 0" in out
    assert "run on the profile's hardware, or plan for this machine: hardware=cpu" in out
    assert "dataset.sources[2].path:" in out and "agentic_coding.jsonl does not exist" in out
    assert "create it (copy the data here), fix dataset.sources[2].path, or remove the source" in out


def test_json_is_one_object_with_every_check(monkeypatch, no_aws):
    _simulate_gpus(monkeypatch, 0)
    result = _cli("preflight", str(REPO / "recipes" / "qwen36_27b.yaml"), "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False and isinstance(report["checks"], list)
    by_name = {c["code"]: c for c in report["checks"]}
    assert all(set(c) == {"code", "key", "status", "message", "fix"} for c in report["checks"])
    assert by_name["gpus"]["status"] == by_name["source agentic_coding"]["status"] == "fail"
    assert by_name["s3"]["status"] == "fail" and "AWS_SECRET_ACCESS_KEY" in by_name["s3"]["fix"]
    # conftest sets HF_HUB_OFFLINE: hub ids are looked up in the local cache, and the check says so
    assert by_name["source openorca"] == {
        "code": "source openorca", "key": "dataset.sources[0].hf_id", "status": "warn",
        "message": "dataset.sources[0].hf_id: Open-Orca/OpenOrca not in the local cache (offline)",
        "fix": "run where the hub is reachable, or download it and use `path:` with a local JSONL/Parquet file"}


def test_tiny_recipe_passes():
    result = _cli("preflight", str(REPO / "recipes" / "tiny.yaml"), "--json")
    assert result.exit_code == 0, result.output
    checks = json.loads(result.stdout)["checks"]
    assert [c["code"] for c in checks] == ["plan", "source tiny_prompts", "target", "tokenizer", "disk", "gpus"]
    assert all(c["status"] == "ok" for c in checks), checks
    assert "built on first use" in checks[2]["message"] and "'<|mask|>'" in checks[3]["message"]


# --------------------------------------------------------------------------- sources


def _source(path: Path, fmt: str = "messages") -> SourceSpec:
    return SourceSpec(name="s", path=str(path), format=fmt)


def test_local_sources_parse_in_their_declared_format(tmp_path):
    good = fakes.write_prompts(tmp_path / "good.jsonl")
    assert pf.check_source(0, _source(good)).status == "ok"
    wrong = pf.check_source(1, _source(good, "alpaca"))
    assert wrong.status == "fail" and "do not parse as alpaca" in wrong.message
    assert "set dataset.sources[1].format (now 'alpaca')" in wrong.fix
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(fakes.write_prompts(tmp_path / "three.jsonl", n=3).read_text() + "{not json\n")
    partly = pf.check_source(0, _source(mixed))
    assert partly.status == "warn" and "1 of the first 4 records" in partly.message
    assert "ingest skips them" in partly.message
    (tmp_path / "empty.jsonl").write_text("")
    assert "holds no records" in pf.check_source(0, _source(tmp_path / "empty.jsonl")).message
    (tmp_path / "data.csv").write_text("a,b\n")
    csv = pf.check_source(0, _source(tmp_path / "data.csv"))
    assert csv.status == "fail" and "is not one of .jsonl" in csv.message


def test_hub_ids_offline_come_from_the_local_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    for var in ("HF_HUB_CACHE", "HF_DATASETS_CACHE"):
        monkeypatch.delenv(var, raising=False)
    spec = SourceSpec(name="orca", hf_id="Open-Orca/OpenOrca")
    missing = pf.check_source(0, spec)
    assert missing.status == "warn" and missing.message.endswith("not in the local cache (offline)")
    (tmp_path / "datasets" / "open-orca___openorca").mkdir(parents=True)  # the datasets cache lowercases
    expected = "dataset.sources[0].hf_id: Open-Orca/OpenOrca in the local cache (offline)"
    assert pf.check_source(0, spec) == pf.Check("source orca", "dataset.sources[0].hf_id", "ok", expected)


# --------------------------------------------------------------------------- target and tokenizer


@pytest.fixture(scope="module")
def local_target(tmp_path_factory) -> tuple[Path, int]:
    """A local target folder: a small Qwen3 config.json and a real BPE tokenizer with `<|mask|>`."""
    from helpers_models import tiny_tokenizer
    from transformers import Qwen3Config

    folder = tmp_path_factory.mktemp("target")
    tok = tiny_tokenizer(folder)
    Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16).save_pretrained(folder)
    return folder, tok.convert_tokens_to_ids("<|mask|>")


def test_local_target_config_and_mask_token(local_target):
    folder, mask = local_target
    target = TargetSpec(model=str(folder))
    assert pf.check_target(target, mask).status == "ok"
    tokenizer = pf.check_tokenizer(target, mask)
    assert tokenizer.status == "ok" and f"mask_token_id {mask} is '<|mask|>'" in tokenizer.message
    outside = pf.check_tokenizer(target, 10_000)
    assert outside.status == "fail"
    assert outside.message.startswith("drafter.mask_token_id 10000 is not in the tokenizer")
    assert "set drafter.mask_token_id" in outside.fix
    assert pf.check_target(target, 10_000).status == "fail"


def test_target_folder_without_config_fails(tmp_path):
    check = pf.check_target(TargetSpec(model=str(tmp_path)), None)
    assert check.status == "fail" and "no config.json (local folder)" in check.message


def test_builtin_target_is_not_built(monkeypatch):
    import dflashx.tiny

    monkeypatch.setattr(dflashx.tiny, "locate_builtin", lambda value: pytest.fail("the preflight built " + value))
    check = pf.check_target(TargetSpec(model="builtin:tiny-qwen3"), 5)
    assert check.status == "ok" and "built on first use" in check.message


# --------------------------------------------------------------------------- disk


def test_disk_covers_the_planned_storage(tmp_path):
    root = tmp_path / "not" / "made" / "yet"
    ok = pf.check_disk(str(root), Totals(storage_bytes=1024), root / "run")
    assert ok.status == "ok" and f"({tmp_path}:" in ok.message
    short = pf.check_disk(str(root), Totals(storage_bytes=2**70), root / "run")
    assert short.status == "fail" and short.message.startswith("storage.root:") and "bigger disk" in short.fix


# --------------------------------------------------------------------------- GPUs (simulated)


def test_gpus_against_the_profile(monkeypatch):
    profile, plan = load_profile("rtx_pro_6000_x4"), Totals(peak_gpu_memory_bytes=70 * GiB)
    _simulate_gpus(monkeypatch, 4)  # simulated: 4 RTX PRO 6000 of 96 GB
    assert pf.check_gpus(profile, plan).status == "ok"
    _simulate_gpus(monkeypatch, 2)
    two = pf.check_gpus(profile, plan)
    assert two.status == "fail" and "wants 4 GPUs, found 2" in two.message
    _simulate_gpus(monkeypatch, 4, "NVIDIA H100 80GB HBM3", 80 * 10**9)
    small = pf.check_gpus(profile, plan)
    assert small.status == "fail" and "less memory than the profile" in small.message
    _simulate_gpus(monkeypatch, 8, "NVIDIA H200", 143_155 * 2**20)  # what torch.cuda reports on a real H200
    other = pf.check_gpus(profile, plan)
    assert other.status == "warn" and "another GPU model" in other.message
    assert "hardware=h200_x8" in other.fix and "hardware=h200_x1" in other.fix
    assert pf.check_gpus(load_profile("cpu"), plan).status == "ok"


# --------------------------------------------------------------------------- attached servers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_attached_servers_answer_health_and_models():
    with ScriptedOpenAIServer() as server:
        ok = pf.check_server(0, server.url + "/v1", "org/scripted-target")
        assert ok.status == "ok"
        assert ok.message == f"stages.generate.urls[0]: {server.url} healthy, serves scripted-target"
        other = pf.check_server(0, server.url, "Qwen/Qwen3-8B")
        assert other.status == "warn" and "not target.model Qwen/Qwen3-8B" in other.message
    with ScriptedOpenAIServer(Script(health_failures=100)) as starting:
        assert pf.check_server(1, starting.url, "scripted-target").status == "warn"
    down = pf.check_server(2, f"http://127.0.0.1:{_free_port()}", "scripted-target")
    assert down.status == "fail" and "stages.generate.urls[2]" in down.message and "does not answer" in down.message


# --------------------------------------------------------------------------- deadline, crashes


def test_a_crashing_or_hanging_check_becomes_a_result():
    def boom() -> pf.Check:
        raise RuntimeError("disk on fire")

    start = time.monotonic()
    crashed, hung = pf._bounded([("disk", boom, "fail"), ("s3", lambda: time.sleep(30), "warn")], timeout_s=0.5)
    assert time.monotonic() - start < 5
    assert crashed.status == "fail" and crashed.message == "disk: the check failed: RuntimeError: disk on fire"
    assert hung == pf.Check("s3", "", "warn", "s3: no answer within 0.5 s",
                            "check the network and the endpoint, then retry")


# --------------------------------------------------------------------------- `dflashx run`


@pytest.fixture
def fake_run(monkeypatch, tmp_path):
    monkeypatch.setattr(orchestrator, "load_stage", fakes.fake_load_stage)
    monkeypatch.setattr(logging.getLogger("dflashx"), "handlers", [])  # the CLI adds its console handler
    fakes.CALLS.clear()
    return tmp_path / "run"


def test_run_stops_on_a_failed_preflight_unless_skipped(tmp_path, fake_run):
    source = fakes.write_prompts(tmp_path / "prompts.jsonl")  # chat records, declared as alpaca below
    recipe = fakes.write_recipe(tmp_path / "recipe.yaml", source, name="pf",
                                **{"dataset.sources": [{"name": "local", "path": str(source), "format": "alpaca"}]})
    stopped = _cli("run", str(recipe), "--run-dir", str(fake_run))
    assert stopped.exit_code == 1 and not fakes.CALLS and "Traceback" not in stopped.output
    assert "preflight fail [source local] dataset.sources[0].path:" in stopped.output
    assert "fix: set dataset.sources[0].format" in stopped.output and "nothing was run" in stopped.output
    skipped = _cli("run", str(recipe), "--run-dir", str(fake_run), "--skip-preflight")
    assert skipped.exit_code == 0, skipped.output
    assert "preflight" not in skipped.output and fakes.CALLS["ingest"] == 1


def test_run_checks_only_what_the_stages_left_to_run_need(tmp_path, fake_run, monkeypatch):
    _simulate_gpus(monkeypatch, 0)
    recipe = fakes.write_recipe(tmp_path / "recipe.yaml", fakes.write_prompts(tmp_path / "p.jsonl"), name="pf")
    assert _cli("run", str(recipe), "--run-dir", str(fake_run)).exit_code == 0
    # the hardware is in no stage key: every stage is done, so no stage needs this machine's GPUs
    done = _cli("run", str(recipe), "hardware=h200_x1", "--run-dir", str(fake_run))
    assert done.exit_code == 0 and done.output.count("(skipped)") == 7, done.output
    forced = _cli("run", str(recipe), "hardware=h200_x1", "--force", "train", "--run-dir", str(fake_run))
    assert forced.exit_code == 1 and "profile h200_x1 wants 1 GPUs, found 0" in forced.output
