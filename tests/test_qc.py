"""QC gate: the seed's failure is caught with the thinking-off diagnosis, healthy data passes."""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from dflashx.cli.main import app
from dflashx.config.schema import QCThresholds
from dflashx.data.jsonl import shard_path, write_jsonl_atomic
from dflashx.data.qc_checks import THINKING_OFF, run_qc
from dflashx.data.qc_report import write_report
from dflashx.stages.tokenize import TokenizePolicy, tokenize_completions
from helpers_tokenizer import completion_record, random_text, tokenizer_dir

N = 300
T = QCThresholds()


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return tokenizer_dir(str(tmp_path_factory.mktemp("tok")))


def write(folder, records):
    write_jsonl_atomic(shard_path(folder, 0), records)
    return folder


def healthy(n: int = N, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [completion_record(rng, i, source=f"s{i % 2}") for i in range(n)]


def seed_failure(n: int = N) -> list[dict]:
    """Like the seed: 87% of responses are `OK.` with empty reasoning (generated with thinking off)."""
    records = healthy(n, seed=1)
    for r in records[: int(n * 0.87)]:
        r.update(reasoning="", answer="OK.")
    return records


@pytest.fixture(scope="module")
def seed_dir(tmp_path_factory):
    return write(tmp_path_factory.mktemp("seed"), seed_failure())


@pytest.fixture(scope="module")
def healthy_dir(tmp_path_factory):
    return write(tmp_path_factory.mktemp("healthy"), healthy())


def by_name(result):
    return {c.name: c for c in result.checks}


def test_seed_failure_fails_with_the_thinking_off_diagnosis(seed_dir, tok_dir):
    result = run_qc(seed_dir, T, tokenizer_path=tok_dir)
    checks = by_name(result)
    assert not result.passed
    assert {"empty_reasoning", "short_answers", "repeated_answer", "mask_spike"} <= {c.name for c in result.failed}
    assert checks["empty_reasoning"].value == pytest.approx(0.87, abs=0.005)
    assert checks["mask_spike"].value == pytest.approx(0.87, abs=0.005)
    message = result.message()
    assert "responses are empty" in message and THINKING_OFF in message
    assert "target.chat_template.enable_thinking" in message
    for check in result.failed:  # every failed check is listed
        assert f"- {check.name}:" in message


def test_thinking_off_still_meets_the_thinking_off_shape(seed_dir, tok_dir):
    """With thinking acknowledged off, empty reasoning is expected and not counted, but the shape
    the seeds' data had (one short repeated answer, a spike of tiny loss masks) still fails."""
    result = run_qc(seed_dir, T, tokenizer_path=tok_dir, enable_thinking=False)
    checks = by_name(result)
    assert checks["empty_reasoning"].skipped
    assert not result.passed and {"repeated_answer", "mask_spike"} <= {c.name for c in result.failed}


@pytest.fixture(scope="module")
def seed_tokenized(tmp_path_factory, seed_dir, tok_dir):
    """The seed's tokenized dataset: tokenized with thinking on, so each `OK.` sample's loss mask
    is exactly `<think>\\n\\n</think>\\n\\nOK.<|im_end|>`."""
    out = tmp_path_factory.mktemp("seed_tok")
    tokenize_completions(seed_dir, out, tok_dir, TokenizePolicy(max_length=512, min_loss_tokens=0))
    return out / "dataset"


def test_seed_shaped_tokenized_dataset_fails_on_the_mask_spike(seed_tokenized, tok_dir):
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    spike = len(tok("<think>\n\n</think>\n\nOK.<|im_end|>", add_special_tokens=False)["input_ids"])
    sizes = [sum(m) for m in load_from_disk(str(seed_tokenized))["loss_mask"]]
    assert sizes.count(spike) == int(N * 0.87)

    bare = run_qc(seed_tokenized, T)  # no tokenizer: mask sizes are exact, texts unknown
    assert not bare.passed and [c.name for c in bare.failed] == ["mask_spike"]
    assert f"exactly {spike} tokens" in bare.failed[0].detail
    assert THINKING_OFF in bare.message()
    assert by_name(bare)["empty_reasoning"].skipped

    decoded = run_qc(seed_tokenized, T, tokenizer_path=tok_dir)  # decoded: reasoning is seen empty
    assert {"empty_reasoning", "mask_spike", "repeated_answer"} <= {c.name for c in decoded.failed}


def test_healthy_data_passes_in_every_input_form(healthy_dir, tok_dir, tmp_path):
    assert run_qc(healthy_dir, T, tokenizer_path=tok_dir).passed
    assert run_qc(healthy_dir, T).passed
    tokenize_completions(healthy_dir, tmp_path, tok_dir, TokenizePolicy(max_length=512))
    assert run_qc(tmp_path / "dataset", T, tokenizer_path=tok_dir).passed


def test_mask_sizes_on_an_even_spread(seed_dir, tok_dir):
    result = run_qc(seed_dir, T, tokenizer_path=tok_dir, mask_sample=50)
    assert len(result.stats.mask_sizes) == 50 and "every 6th sample" in result.unit_note
    assert by_name(result)["mask_spike"].value == pytest.approx(0.87, abs=0.05)
    assert result.stats.n == N  # the text checks still see every sample


def test_without_tokenizer_sizes_are_words_and_it_says_so(seed_dir):
    result = run_qc(seed_dir, T)
    assert result.stats.unit == "words" and "whitespace-separated words" in result.unit_note
    assert "exactly 1 words" in by_name(result)["mask_spike"].detail


def chat_record(i: int, rng: random.Random, content: str, **extra) -> dict:
    return {"id": f"c{i}", "messages": [{"role": "user", "content": random_text(rng, 8)},
                                        {"role": "assistant", "content": content, **extra}]}


def test_plain_chat_jsonl_inline_and_reasoning_content(tmp_path, tok_dir):
    rng = random.Random(5)
    inline = [chat_record(i, rng, f"<think>{random_text(rng, 30)}</think>{random_text(rng, 12)}") for i in range(60)]
    field = [chat_record(i + 60, rng, random_text(rng, 12), reasoning_content=random_text(rng, 30)) for i in range(60)]
    write_jsonl_atomic(tmp_path / "chat.jsonl", inline + field)
    result = run_qc(tmp_path / "chat.jsonl", T, tokenizer_path=tok_dir)
    assert result.passed, result.message()
    assert by_name(result)["truncated"].skipped  # no finish_reason in chat JSONL

    broken = inline[:50] + [chat_record(i, rng, f"<think>{random_text(rng, 30)}") for i in range(100, 110)]
    write_jsonl_atomic(tmp_path / "broken.jsonl", broken)
    failed = run_qc(tmp_path / "broken.jsonl", T)
    # unclosed: all text is reasoning and the answer is empty, so short/repeated answers fail too
    assert {c.name for c in failed.failed} == {"think_markers", "short_answers", "repeated_answer"}
    assert by_name(failed)["think_markers"].value == pytest.approx(10 / 60)
    assert "reasoning parser" in failed.message()


def test_inline_think_markers_in_a_completion_answer_fail(tmp_path):
    records = healthy(100)
    for r in records[:10]:
        r["answer"] = "</think>" + r["answer"]
    assert [c.name for c in run_qc(write(tmp_path, records), T).failed] == ["think_markers"]


def test_truncation_and_duplicates(tmp_path):
    records = healthy(100)
    for r in records[:10]:
        r["finish_reason"] = "length"
    for r in records[50:60]:
        r.update(reasoning=records[40]["reasoning"], answer=records[40]["answer"])
    result = run_qc(write(tmp_path, records), T)
    failed = {c.name: c for c in result.failed}
    assert set(failed) == {"truncated", "duplicate_responses"}
    assert failed["truncated"].value == pytest.approx(0.10)
    assert failed["duplicate_responses"].value == pytest.approx(0.10)
    assert "stages.generate.max_tokens" in result.message()


def test_thinking_off_skips_the_empty_reasoning_check(tmp_path):
    records = healthy(100)
    for r in records:
        r["reasoning"] = ""
    folder = write(tmp_path, records)
    assert [c.name for c in run_qc(folder, T).failed] == ["empty_reasoning"]
    off = run_qc(folder, T, enable_thinking=False)
    assert off.passed and by_name(off)["empty_reasoning"].skipped == "thinking was not requested"


def test_report_files(seed_dir, tmp_path):
    result = run_qc(seed_dir, T)
    files = write_report(result, tmp_path, T.mask_spike_max_tokens)
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# QC report: FAILED") and THINKING_OFF in report
    data = json.loads((tmp_path / "qc.json").read_text())
    assert data["passed"] is False and data["samples"] == N
    assert {c["name"] for c in data["checks"] if not c["passed"]} == {c.name for c in result.failed}
    pngs = [f for f in files.values() if f.endswith(".png")]
    assert len(pngs) == 3
    for png in pngs:
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*"))  # no temporary files left


def test_cli_exit_codes(seed_dir, healthy_dir, tok_dir, tmp_path):
    runner = CliRunner()
    bad = runner.invoke(app, ["qc", str(seed_dir), "--out", str(tmp_path / "r")])
    assert bad.exit_code == 1 and "thinking seems off" in bad.output
    assert (tmp_path / "r" / "report.md").exists()
    good = runner.invoke(app, ["qc", str(healthy_dir), "--tokenizer", str(tok_dir)])
    assert good.exit_code == 0 and "QC passed" in good.output
    off = runner.invoke(app, ["qc", str(seed_dir), "--no-enable-thinking"])
    assert off.exit_code == 1 and "empty_reasoning: not checked" in off.output
    (tmp_path / "junk.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\nnot json\n')
    junk = runner.invoke(app, ["qc", str(tmp_path / "junk.jsonl")])
    assert junk.exit_code == 2 and "junk.jsonl:1" in junk.output and "last message is not an assistant" in junk.output
    (tmp_path / "torn.jsonl").write_text(healthy_line(healthy_dir) + "not json\n")
    torn = runner.invoke(app, ["qc", str(tmp_path / "torn.jsonl")])
    assert torn.exit_code == 2 and "torn.jsonl:2: not JSON" in torn.output


def healthy_line(folder):
    """The first record of a healthy completions folder, as one JSONL line."""
    return next(p for p in sorted(folder.glob("*.jsonl"))).read_text().splitlines()[0] + "\n"


def test_stage_raises_stage_failed_listing_every_failed_check(seed_dir, healthy_dir, tok_dir, tmp_path):
    from dflashx.stages.base import StageFailed
    from dflashx.stages.qc import run
    from helpers_models import make_recipe, stage_context

    recipe = make_recipe(target={"model": str(tok_dir), "tokenizer": str(tok_dir), "precision": "fp32"})
    ctx = stage_context("qc", recipe, tmp_path / "bad", {"generate.completions": seed_dir})
    with pytest.raises(StageFailed) as info:
        run(ctx)
    assert THINKING_OFF in str(info.value) and info.value.metrics["passed"] is False
    assert str(info.value).count("\n- ") == info.value.metrics["failed_checks"] >= 4
    assert (ctx.out_dir / "report" / "report.md").exists()
    ok = run(stage_context("qc", recipe, tmp_path / "good", {"generate.completions": healthy_dir}))
    assert ok.metrics["passed"] is True and ok.artifacts["report"].path == "report"


def _with_rejected(count: int) -> list[dict]:
    records = healthy(200, seed=3)
    for r in records[:count]:
        r.update(reasoning="", answer="", finish_reason="error", error="HTTP 400 from http://x: input too long")
    return records


def test_rejected_prompts_are_counted_not_judged_as_empty(tmp_path):
    result = run_qc(write(tmp_path, _with_rejected(1)), T)
    checks = by_name(result)
    assert checks["rejected"].passed and checks["rejected"].value == pytest.approx(1 / 200)
    assert checks["empty_reasoning"].value == 0 and checks["short_answers"].value == 0  # not counted there
    assert sum(s["rejected"] for s in result.stats.per_source().values()) == 1


def test_too_many_rejected_prompts_fail_the_gate_naming_the_context_length(tmp_path):
    result = run_qc(write(tmp_path, _with_rejected(10)), T)
    rejected = by_name(result)["rejected"]
    assert not rejected.passed and "context_length" in rejected.cause and rejected.examples
    assert "rejected" in result.message()
