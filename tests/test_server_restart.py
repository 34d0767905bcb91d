"""A launched server that dies while generating is started again and its requests sent again, each launch's log
kept (`ServerPool.revive`); what a launch command's words mean here (`LaunchArgs`); vLLM's counters read from its
`/metrics` text. The server is the scripted OpenAI server run as a process (tests/openai_server.py: it stands in
for an engine so the fast tier needs none; tests/test_engine_vllm.py kills real vLLM servers)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from test_backend_sglang import cfg, prompts

from dflashx.backends.servers import LaunchArgs, ServerError
from dflashx.backends.sglang import SGLangBackend
from dflashx.backends.vllm import SpecCounters, VLLMBackend
from dflashx.config.schema import ChatTemplateSpec
from dflashx.dflash.distributed import free_port
from dflashx.plan.launch import LaunchPlan, ServerSpec

HERE = Path(__file__).parent
HEADER = "==== dflashx: launch at"


def _launched(tmp_path: Path, restarts: int, backend=SGLangBackend):
    port = free_port()
    command = ("python", str(HERE / "openai_server.py"), "--port", str(port), "--delay-s", "0.05")
    plan = LaunchPlan("spawn", 4, (ServerSpec(f"http://127.0.0.1:{port}", 4, command, port, (), 0),))
    config = cfg([], server_startup_timeout_s=30, server_restarts=restarts, retry_backoff_s=0.01)
    made = backend(config, ChatTemplateSpec(), "m", plan, tmp_path, node=0, launch_args=LaunchArgs(sys.executable))
    made.pool.poll_s = 0.05
    return made, tmp_path / f"server-{port}.log"


def _kill_at(backend, counts: set[int], out: list[dict]):
    def emit(record: dict) -> None:
        out.append(record)
        if len(out) in counts:
            for proc, _ in backend.pool.procs.values():
                os.killpg(proc.pid, signal.SIGKILL)
    return emit


@pytest.mark.parametrize("backend", [SGLangBackend, VLLMBackend])
def test_a_killed_server_is_started_again_and_every_prompt_is_written_once(tmp_path, backend):
    made, log = _launched(tmp_path, restarts=2, backend=backend)
    out: list[dict] = []
    with made:
        made.generate(prompts(40), _kill_at(made, {10, 25}, out))
    assert sorted(r["id"] for r in out) == sorted(p["id"] for p in prompts(40))  # each once, none lost
    assert made.stats.server_restarts == 2 and made.stats.failed == 0
    assert log.read_text().count(HEADER) == 3  # the first launch and two restarts, one log


def test_restarts_run_out_with_the_log_and_what_to_do(tmp_path):
    made, log = _launched(tmp_path, restarts=0)
    out: list[dict] = []
    with pytest.raises(ServerError, match=r"(?s)exited with code -9 while generating, after 0 restart.*rerun"), made:
        made.generate(prompts(20), _kill_at(made, {5}, out))
    assert 5 <= len(out) < 20 and log.read_text().count(HEADER) == 1


def test_a_launch_command_gets_this_interpreter_and_the_located_target():
    args = LaunchArgs("/venv/bin/python", (("builtin:tiny-qwen3", "/cache/tiny"),))
    assert args.command(("python", "-m", "vllm.entrypoints.openai.api_server", "--model", "builtin:tiny-qwen3")) == [
        "/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/cache/tiny"]
    assert args.command(("/usr/bin/env", "python")) == ["/usr/bin/env", "python"]  # only a leading `python`


METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 166.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7965871450390325e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 1162.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 556.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 137.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 113.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 7.0
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def test_vllm_counters_are_read_from_its_metrics_text():
    """A /metrics text of vLLM 0.32's CPU build (the tiny drafter, 16 held-out prompts), plus a second engine."""
    c = SpecCounters.parse(METRICS)
    assert (c.drafts, c.draft_tokens, c.accepted) == (166.0, 1162.0, 556.0)
    assert c.accepted_per_pos == (137.0, 120.0) and c.tau == pytest.approx(1 + 556 / 166)
    assert c.acceptance_by_position == pytest.approx([137 / 166, 120 / 166])
    assert (c - SpecCounters(100.0, 700.0, 300.0, (80.0,))).accepted_per_pos == (57.0, 120.0)
    assert SpecCounters.parse("vllm:num_requests_running 0.0\n").tau is None  # no speculation
