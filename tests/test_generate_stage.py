"""The generate stage end to end: ingest shards in, completion shards out, metrics, failure, resume."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_models import make_recipe, stage_context
from openai_server import Script, ScriptedOpenAIServer, expected_reply

from dflashx.data.jsonl import iter_shards, shard_paths, write_jsonl_atomic
from dflashx.data.qc_checks import run_qc
from dflashx.stages import generate
from dflashx.stages.base import StageFailed


def write_prompts(folder: Path, n: int, per_shard: int = 10) -> list[dict]:
    rows = [{"id": f"id{i:04d}", "source": "s", "messages": [{"role": "user", "content": f"prompt {i}"}]}
            for i in range(n)]
    for k in range(0, n, per_shard):
        write_jsonl_atomic(folder / f"shard-{k // per_shard:05d}.jsonl", rows[k:k + per_shard])
    return rows


def context(tmp_path: Path, url: str, n: int = 25, **gen):
    prompts_dir = tmp_path / "run" / "ingest" / "prompts"
    rows = write_prompts(prompts_dir, n)
    stages = {"generate": {"backend": "sglang", "urls": [url], "concurrency": 3, "flush_every": 4,
                           "shard_size": 10, "retries": 2, "retry_backoff_s": 0.01, "request_timeout_s": 5,
                           "server_startup_timeout_s": 5, **gen}}
    logged: list[tuple[dict, int | None]] = []
    ctx = stage_context("generate", make_recipe(stages=stages), tmp_path / "run",
                        inputs={"ingest.prompts": prompts_dir}, log=lambda m, step=None: logged.append((m, step)))
    return ctx, rows, logged


def test_stage_writes_every_prompt_once_with_metrics(tmp_path, monkeypatch):
    monkeypatch.setattr(generate, "LOG_EVERY_S", 0.0)  # log on every record instead of every 30 s
    with ScriptedOpenAIServer(Script(length_every=4, fail_first=1)) as server:
        ctx, rows, logged = context(tmp_path, server.url)
        result = generate.run(ctx)
    folder = ctx.out_dir / result.artifacts["completions"].path
    records = list(iter_shards(folder))
    assert sorted(r["id"] for r in records) == [r["id"] for r in rows]
    assert [len(list(iter_shards(p))) for p in shard_paths(folder)] == [10, 10, 5]
    for r in records:
        assert (r["reasoning"], r["answer"]) == expected_reply(r["messages"])
        assert set(r) >= {"id", "source", "messages", "reasoning", "answer", "finish_reason", "usage", "backend"}
    m = result.metrics
    lengths = sum(r["finish_reason"] == "length" for r in records)
    assert m["finish_length_frac"] == pytest.approx(lengths / 25) and 0 < lengths < 25
    assert m["retries"] == 25 and m["errors"] == 0 and m["completions_written"] == 25
    assert m["output_tokens"] == sum(r["usage"]["completion_tokens"] for r in records)
    assert m["output_tokens_per_s"] > 0 and m["completions_total"] == 25
    assert logged[-1] == (m, 25)  # the final figures, at step = completions written
    assert [step for _, step in logged[:-1]] == list(range(1, 26))


def test_resume_generates_only_the_missing_ids(tmp_path):
    with ScriptedOpenAIServer() as server:
        ctx, rows, _ = context(tmp_path, server.url)
        done = rows[:7]
        write_jsonl_atomic(ctx.out_dir / "completions" / "shard-00000.jsonl",
                           [{**r, "reasoning": "r", "answer": "a", "finish_reason": "stop",
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1}, "backend": "sglang"} for r in done])
        result = generate.run(ctx)
    asked = {m["messages"][-1]["content"] for m in server.requests}
    assert asked == {r["messages"][-1]["content"] for r in rows[7:]}
    assert result.metrics["completions_resumed"] == 7 and result.metrics["completions_written"] == 18
    assert sorted(r["id"] for r in iter_shards(ctx.out_dir / "completions")) == [r["id"] for r in rows]


def test_prompts_that_keep_failing_fail_the_stage_and_a_rerun_retries_them(tmp_path):
    with ScriptedOpenAIServer(Script(fail_first=100)) as server:
        ctx, _rows, _ = context(tmp_path, server.url, n=4, retries=1)
        with pytest.raises(StageFailed, match=r"4 prompts failed after 1 retries.*rerun to retry"):
            generate.run(ctx)
    with ScriptedOpenAIServer() as server2:
        ctx2, _, _ = context(tmp_path, server2.url, n=4, retries=1)  # the same run folder, the server back up
        result = generate.run(ctx2)
    assert result.metrics["completions_total"] == 4 and result.metrics["failed"] == 0


def test_rejected_prompts_are_written_with_their_error_and_counted(tmp_path):
    with ScriptedOpenAIServer(Script(reject_marker="prompt 3")) as server:
        ctx, _, _ = context(tmp_path, server.url, n=5)
        result = generate.run(ctx)
    errors = [r for r in iter_shards(ctx.out_dir / "completions") if "error" in r]
    assert [r["id"] for r in errors] == ["id0003"] and result.metrics["errors"] == 1


def test_transformers_backend_through_the_stage(tmp_path):
    from helpers_models import tiny_target

    target = tiny_target(tmp_path / "target")
    prompts_dir = tmp_path / "run" / "ingest" / "prompts"
    rows = write_prompts(prompts_dir, 6)
    recipe = make_recipe(target={"model": str(target), "precision": "fp32"},
                         stages={"generate": {"backend": "transformers", "max_tokens": 8, "temperature": 0,
                                              "batch_size": 4}})
    ctx = stage_context("generate", recipe, tmp_path / "run", inputs={"ingest.prompts": prompts_dir})
    result = generate.run(ctx)
    records = list(iter_shards(ctx.out_dir / "completions"))
    assert sorted(r["id"] for r in records) == [r["id"] for r in rows]
    assert all(r["backend"] == "transformers" and r["usage"]["completion_tokens"] <= 8 for r in records)
    assert result.metrics["output_tokens"] == sum(r["usage"]["completion_tokens"] for r in records)


def tiny_context(tmp_path: Path, url: str, rows: list[dict], **gen):
    """The generate stage on the built-in tiny target (its tokenizer is in the package)."""
    prompts_dir = tmp_path / "run" / "ingest" / "prompts"
    write_jsonl_atomic(prompts_dir / "shard-00000.jsonl", rows)
    stages = {"generate": {"backend": "sglang", "urls": [url], "concurrency": 2, "retries": 1,
                           "retry_backoff_s": 0.01, "request_timeout_s": 5, "server_startup_timeout_s": 5, **gen}}
    recipe = make_recipe(target={"model": "builtin:tiny-qwen3"}, stages=stages)
    return stage_context("generate", recipe, tmp_path / "run", inputs={"ingest.prompts": prompts_dir})


def test_a_prompt_over_the_context_is_refused_before_it_is_sent_and_counted_once(tmp_path):
    rows = write_prompts(tmp_path / "unused", 5)
    long_text = " ".join(f"word{i}" for i in range(400))  # a few hundred tokens of the tiny tokenizer
    rows.append({"id": "long", "source": "s", "messages": [{"role": "user", "content": long_text}]})
    with ScriptedOpenAIServer() as server:
        ctx = tiny_context(tmp_path, server.url, rows, max_tokens=64, context_length=256)
        result = generate.run(ctx)
        asked = {m["messages"][-1]["content"] for m in server.requests}
    assert long_text not in asked and len(asked) == 5  # never sent
    records = {r["id"]: r for r in iter_shards(ctx.out_dir / "completions")}
    refused = records["long"]
    assert refused["finish_reason"] == "error" and refused["usage"]["prompt_tokens"] + 64 > 256
    assert "stages.generate.context_length 256" in refused["error"] and "max_tokens" in refused["error"]
    assert result.metrics["refused_too_long"] == 1 and result.metrics["rejected"] == 1
    qc = run_qc(ctx.out_dir / "completions", ctx.recipe.stages.qc.thresholds)
    assert qc.stats.rejected == 1 and qc.stats.rejected_examples == ["long"]
    # a resumed run neither sends it nor writes it again
    with ScriptedOpenAIServer() as server2:
        again = generate.run(tiny_context(tmp_path, server2.url, rows, max_tokens=64, context_length=256))
    assert server2.requests == [] and again.metrics["completions_total"] == 6
    assert sorted(r["id"] for r in iter_shards(ctx.out_dir / "completions")) == sorted(records)


def test_without_a_tokenizer_prompts_go_to_the_server_which_decides(tmp_path, caplog):
    with ScriptedOpenAIServer() as server:
        ctx, _rows, _ = context(tmp_path, server.url, n=3)  # target `unused`: no tokenizer to count with
        result = generate.run(ctx)
    assert len(server.requests) == 3 and result.metrics["refused_too_long"] == 0
    assert "not checked against stages.generate.context_length" in caplog.text


def test_the_gate_refuses_a_prompt_that_reaches_the_context_exactly(tmp_path):
    """SGLang refuses input + max_new_tokens >= --context-length: the limit itself is refused,
    one token of room is let through."""
    from transformers import AutoTokenizer

    from dflashx.backends.context_gate import ContextGate, render_prompt
    from dflashx.config.schema import ChatTemplateSpec
    from dflashx.targets.locate import locate_tokenizer

    target = make_recipe(target={"model": "builtin:tiny-qwen3"}).target
    tok = AutoTokenizer.from_pretrained(str(locate_tokenizer(target)))
    chat = ChatTemplateSpec()
    prompt = {"id": "p", "messages": [{"role": "user", "content": " ".join(["word"] * 300)}]}
    n = len(tok(render_prompt(tok, prompt, chat), add_special_tokens=False)["input_ids"])
    refused = []
    at_limit = ContextGate(tok, chat, max_tokens=8, context_length=n + 8)
    assert list(at_limit.admit([prompt], lambda p, k, e: refused.append(k))) == [] and refused == [n]
    one_more = ContextGate(tok, chat, max_tokens=8, context_length=n + 9)
    assert list(one_more.admit([prompt], lambda p, k, e: refused.append(k))) == [prompt] and refused == [n]
