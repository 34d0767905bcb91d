"""The sglang backend against real HTTP servers on 127.0.0.1 (scripted: SGLang itself needs a GPU).

Covers the request it sends, the three places reasoning can come back, retries on 500s, dropped
connections and slow replies, permanent 400s, giving up, spreading over replicas, waiting for
/health, and launching the plan's server commands with their logs and CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from openai_server import MODEL_NAME, Script, ScriptedOpenAIServer, expected_reply

from dflashx.backends.base import split_think
from dflashx.backends.servers import ServerError, wait_healthy
from dflashx.backends.http import backoff_s
from dflashx.backends.sglang import SGLangBackend, accept_length_of
from dflashx.config.schema import ChatTemplateSpec, GenerateStage
from dflashx.dflash.distributed import free_port
from dflashx.plan.launch import LaunchPlan, ServerSpec, base_url

HERE = Path(__file__).parent


def prompts(n: int, tools: bool = False) -> list[dict]:
    out = []
    for i in range(n):
        p = {"id": f"p{i}", "source": "t", "messages": [{"role": "system", "content": "Be brief."},
                                                       {"role": "user", "content": f"question number {i}"}]}
        if tools:
            p["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        out.append(p)
    return out


def cfg(urls: list[str], **kw) -> GenerateStage:
    base = {"urls": urls, "concurrency": 4, "retries": 3, "retry_backoff_s": 0.01, "request_timeout_s": 10,
            "server_startup_timeout_s": 10, "max_tokens": 77, "temperature": 0.6, "top_p": 0.9}
    return GenerateStage(**{**base, **kw})


def attached(c: GenerateStage, chat: ChatTemplateSpec, model: str) -> SGLangBackend:
    """The backend on `c.urls`, each keeping `c.concurrency` open: the launch plan the planner makes for
    attached URLs with one replica each (tests/test_launch_plan.py checks the planner's side)."""
    n = c.concurrency or 1
    return SGLangBackend(c, chat, model, LaunchPlan("attach", n, tuple(ServerSpec(base_url(u), n) for u in c.urls)),
                         node=0)


def generate(backend: SGLangBackend, items: list[dict]) -> dict[str, dict]:
    out: list[dict] = []
    with backend:
        backend.generate(items, out.append)
    by_id = {r["id"]: r for r in out}
    assert len(by_id) == len(out)
    return by_id


def test_request_carries_recipe_settings_and_reasoning_field_is_kept():
    with ScriptedOpenAIServer(Script(reasoning="field", length_every=3)) as server:
        chat = ChatTemplateSpec(enable_thinking=True, kwargs={"thinking_budget": 5})
        out = generate(attached(cfg([server.url + "/v1/"]), chat, "my/model"), prompts(12, tools=True))
    body = server.requests[0]
    assert body["model"] == MODEL_NAME  # the served name from /v1/models
    assert body["chat_template_kwargs"] == {"thinking_budget": 5, "enable_thinking": True}
    assert (body["max_tokens"], body["temperature"], body["top_p"]) == (77, 0.6, 0.9)
    assert body["tools"][0]["function"]["name"] == "f" and body["messages"][0]["role"] == "system"
    for p in prompts(12):
        r = out[p["id"]]
        assert (r["reasoning"], r["answer"]) == expected_reply(p["messages"])
        assert r["backend"] == "sglang" and r["usage"]["completion_tokens"] > 0 and "error" not in r
    assert {r["finish_reason"] for r in out.values()} == {"stop", "length"}


def test_the_servers_accept_length_is_read_after_the_last_prompt():
    """Speculative decoding on: the pooled cumulative counters of every server (not a recent window)."""
    with ScriptedOpenAIServer(Script(spec_counters=(300, 100))) as a, \
            ScriptedOpenAIServer(Script(spec_counters=(100, 100))) as b:
        backend = attached(cfg([a.url, b.url]), ChatTemplateSpec(), "my/model")
        generate(backend, prompts(4))
    assert backend.stats.spec_accept_length == pytest.approx(2.0)
    with ScriptedOpenAIServer(Script()) as plain:  # no counters: no figure
        backend = attached(cfg([plain.url]), ChatTemplateSpec(), "my/model")
        generate(backend, prompts(2))
    assert backend.stats.spec_accept_length is None
    assert accept_length_of([{"internal_states": [{"avg_spec_accept_length": 3.0}, {"avg_spec_accept_length": 2.0},
                                                  {"avg_spec_accept_length": None}]}]) == 2.5


def test_inline_think_is_split_and_thinking_off_is_sent():
    with ScriptedOpenAIServer(Script(reasoning="inline")) as server:
        out = generate(attached(cfg([server.url]), ChatTemplateSpec(), "m"), prompts(3))
        assert all((r["reasoning"], r["answer"]) == expected_reply(r["messages"]) for r in out.values())
        off = generate(attached(cfg([server.url]), ChatTemplateSpec(enable_thinking=False), "m"), prompts(2))
    assert server.requests[-1]["chat_template_kwargs"]["enable_thinking"] is False
    assert all(r["reasoning"] == "" and r["answer"] == expected_reply(r["messages"])[1] for r in off.values())


def test_500s_and_dropped_connections_are_retried():
    with ScriptedOpenAIServer(Script(fail_first=1, drop_first=1)) as server:
        backend = attached(cfg([server.url]), ChatTemplateSpec(), "m")
        out = generate(backend, prompts(10))
    assert len(out) == 10 and all(r["answer"] == expected_reply(r["messages"])[1] for r in out.values())
    assert backend.stats.retries == 20 and backend.stats.failed == 0
    assert set(server.attempts.values()) == {3}


def test_slow_replies_time_out_and_are_retried_then_given_up():
    with ScriptedOpenAIServer(Script(delay_s=1.0)) as server:
        backend = attached(cfg([server.url], request_timeout_s=0.2, retries=1), ChatTemplateSpec(), "m")
        out = generate(backend, prompts(2))
    assert out == {}  # nothing emitted: the stage will retry these on resume
    assert backend.stats.failed == 2 and backend.stats.retries == 2
    assert "Timeout" in backend.stats.first_error


def test_slow_replies_within_the_timeout_succeed():
    with ScriptedOpenAIServer(Script(delay_s=0.05, jitter_s=0.05)) as server:
        backend = attached(cfg([server.url], concurrency=8), ChatTemplateSpec(), "m")
        out = generate(backend, prompts(24))
    assert len(out) == 24 and backend.stats.retries == 0


def test_in_flight_requests_are_bounded_by_concurrency():
    with ScriptedOpenAIServer(Script(delay_s=0.05)) as server:
        generate(attached(cfg([server.url], concurrency=3), ChatTemplateSpec(), "m"), prompts(30))
    assert server.max_in_flight == 3


def test_each_url_keeps_its_launch_plan_in_flight():
    """The client opens exactly the launch plan's `in_flight` per URL (nothing re-defaulted from the recipe):
    a dp_size server with 4 replicas behind it planned at 3 each gets 12 here although concurrency is 2."""
    with ScriptedOpenAIServer(Script(delay_s=0.3)) as server:
        plan = LaunchPlan("attach", 3, (ServerSpec(server.url, 12),))
        generate(SGLangBackend(cfg([server.url], concurrency=2), ChatTemplateSpec(), "m", plan, node=0), prompts(48))
    assert server.max_in_flight == 12


def test_a_dp_size_server_gets_its_in_flight_from_the_plan_json():
    entry = {"command": ["python", "-m", "x"], "port": 1, "url": "http://127.0.0.1:1", "gpus": [0, 1], "node": 0,
             "in_flight": 64, "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}}
    spec = ServerSpec.from_json(entry)
    assert spec.in_flight == 64 and spec.gpus == (0, 1) and spec.to_json() == entry
    older = {k: v for k, v in entry.items() if k != "env"}  # a plan.json written before servers had an env
    assert ServerSpec.from_json(older).env == ()


def test_permanent_rejection_is_recorded_not_retried():
    with ScriptedOpenAIServer(Script(reject_marker="number 1")) as server:
        backend = attached(cfg([server.url]), ChatTemplateSpec(), "m")
        out = generate(backend, prompts(3))
    assert "HTTP 400" in out["p1"]["error"] and out["p1"]["finish_reason"] == "error"
    assert "error" not in out["p0"] and backend.stats.rejected == 1 and backend.stats.retries == 0


def test_work_is_spread_over_replicas_and_a_dead_replica_is_routed_around():
    with ScriptedOpenAIServer(Script(delay_s=0.02)) as a, ScriptedOpenAIServer(Script(delay_s=0.02)) as b:
        out = generate(attached(cfg([a.url, b.url], concurrency=2), ChatTemplateSpec(), "m"), prompts(20))
        assert len(out) == 20 and len(a.requests) >= 4 and len(b.requests) >= 4
        # a replica that dies after start-up: call generate without the health check on enter
        dead = f"http://127.0.0.1:{free_port()}"
        backend = attached(cfg([a.url, dead], concurrency=2), ChatTemplateSpec(), "m")
        out2: list[dict] = []
        backend.generate(prompts(6), out2.append)
    assert len(out2) == 6 and backend.stats.failed == 0 and backend.stats.retries >= 1


def test_servers_that_stay_down_stop_the_run_early():
    dead = f"http://127.0.0.1:{free_port()}"
    backend = attached(cfg([dead], concurrency=2, retries=1), ChatTemplateSpec(), "m")
    out: list[dict] = []
    with pytest.raises(ServerError, match=r"\d+ prompts in a row failed.*seem down"):
        backend.generate(prompts(50), out.append)
    assert out == [] and backend.stats.failed < 50


def test_waits_for_health_then_times_out_clearly():
    with ScriptedOpenAIServer(Script(health_failures=2)) as server:
        wait_healthy([server.url], timeout_s=10, poll_s=0.01)
        assert server.health_calls == 3
    with pytest.raises(ServerError, match="not healthy after"):
        wait_healthy([f"http://127.0.0.1:{free_port()}"], timeout_s=0.3, poll_s=0.05)


def test_launches_plan_servers_with_logs_and_gpus(tmp_path):
    port = free_port()
    command = [sys.executable, str(HERE / "openai_server.py"), "--port", str(port), "--health-failures", "1"]
    plan = LaunchPlan("spawn", 4, (ServerSpec(f"http://127.0.0.1:{port}", 4, tuple(command), port, (2, 3), 0),))
    backend = SGLangBackend(cfg([], server_startup_timeout_s=30), ChatTemplateSpec(), "m", plan, tmp_path, node=0)
    backend.pool.poll_s = 0.1
    out = generate(backend, prompts(4))
    assert len(out) == 4
    assert "CUDA_VISIBLE_DEVICES=2,3" in (tmp_path / f"server-{port}.log").read_text()
    assert all(proc.poll() is not None for proc, _ in backend.pool.procs.values())  # stopped on exit


def test_a_server_that_dies_while_starting_fails_with_its_log(tmp_path):
    command = (sys.executable, "-c", "print('CUDA out of memory'); raise SystemExit(3)")
    plan = LaunchPlan("spawn", 1, (ServerSpec("http://127.0.0.1:1", 1, command, 1, (0,), 0),))
    backend = SGLangBackend(cfg([], server_startup_timeout_s=30), ChatTemplateSpec(), "m", plan, tmp_path, node=0)
    with pytest.raises(ServerError, match=r"(?s)exited with code 3.*CUDA out of memory"):
        backend.__enter__()


def test_no_servers_and_no_urls_is_a_clear_error():
    for plan in (None, LaunchPlan("spawn", 4), LaunchPlan("in-process", 4)):
        with pytest.raises(ValueError, match=r"stages\.generate\.urls is empty"):
            SGLangBackend(cfg([]), ChatTemplateSpec(), "m", plan, node=0)


def test_backoff_grows_with_jitter_and_is_capped():
    delays = [backoff_s(a, 1.0) for a in range(10)]
    assert 0.5 <= delays[0] <= 1.0 and 4.0 <= delays[3] <= 8.0
    assert max(delays) <= 60.0 and len({round(backoff_s(2, 1.0), 9) for _ in range(20)}) > 1


@pytest.mark.parametrize("text, opened, expected", [
    ("<think>\nr\n</think>\n\na", False, ("r", "a")),
    ("r\n</think>\n\na", True, ("r", "a")),
    ("<think>\ncut off", False, ("cut off", "")),
    ("cut off", True, ("cut off", "")),
    ("just an answer", False, ("", "just an answer")),
])
def test_split_think(text, opened, expected):
    assert split_think(text, opened) == expected
