"""Per-source quality: QC's per-source table, eval's tau per source and per context bucket (on a
real tiny target and drafter), the acceptance figure's panels, and `compare` side by side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers_dflash import drafter_config, load_target, tiny_target
from helpers_models import make_recipe, stage_context
from helpers_tokenizer import tokenizer_dir
from s3_fixtures import make_run
from test_qc import T, healthy, write
from typer.testing import CliRunner

from dflashx.cli.main import app
from dflashx.data.qc_checks import run_qc
from dflashx.data.qc_report import write_report
from dflashx.dflash.acceptance import CONTEXT_PANEL, SOURCE_PANEL, acceptance_figure, context_bucket
from dflashx.dflash.checkpoint import save_drafter
from dflashx.dflash.model import DFlashDrafter
from dflashx.report.compare import compare
from dflashx.report.runinfo import RunInfo
from dflashx.stages import eval as eval_stage


def two_sources(n: int = 100) -> list[dict]:
    """`healthy` records of sources s0 and s1 (alternating); 4 of s1 truncated, one with no source."""
    records = healthy(n)
    for r in [r for r in records if r["source"] == "s1"][:4]:
        r["finish_reason"] = "length"
    del records[0]["source"]
    return records


def test_qc_reports_each_sources_share_loss_and_truncations(tmp_path):
    records = two_sources()
    result = run_qc(write(tmp_path / "data", records), T)
    table = result.stats.per_source()
    assert list(table) == ["s0", "s1", "unknown"]
    assert [table[s]["samples"] for s in table] == [49, 50, 1]
    assert table["s1"]["share"] == pytest.approx(0.5) and table["s1"]["truncated"] == 4
    assert table["s1"]["truncated_frac"] == pytest.approx(4 / 50) and table["s0"]["truncated"] == 0
    words = {s: sum(len(r["reasoning"].split()) + len(r["answer"].split()) for r in records
                    if r.get("source", "unknown") == s) for s in table}
    assert {s: row["loss_words"] for s, row in table.items()} == words  # no tokenizer: words
    assert sum(row["loss_share"] for row in table.values()) == pytest.approx(1.0)

    write_report(result, tmp_path / "report", T.mask_spike_max_tokens)
    data = json.loads((tmp_path / "report" / "qc.json").read_text())
    assert data["per_source"] == json.loads(json.dumps(table))
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Per source" in md and "| s1 | 50 | 50.0% |" in md and "| 4 | 8.0% |" in md


def test_qc_per_source_loss_is_tokens_with_a_tokenizer(tmp_path):
    tok = tokenizer_dir(str(tmp_path / "tok"))
    result = run_qc(write(tmp_path / "data", two_sources(40)), T, tokenizer_path=tok, mask_sample=20)
    table = result.stats.per_source()
    assert all("loss_tokens" in row and "loss_words" not in row for row in table.values())
    assert sum(row["loss_measured"] for row in table.values()) == len(result.stats.mask_sizes) == 20
    assert sum(row["loss_tokens"] for row in table.values()) == sum(result.stats.mask_sizes)


LONG = " ".join(f"add {i} and {i + 3}" for i in range(200))  # > 512 tokens with the tiny tokenizer
PROMPTS = [
    {"id": "m0", "source": "math", "messages": [{"role": "user", "content": "add 1 and 4"}]},
    {"id": "c0", "source": "code", "messages": [{"role": "user", "content": "sort 3 10 2"}]},
    {"id": "m1", "source": "math", "messages": [{"role": "user", "content": LONG}]},
    {"id": "x0", "messages": [{"role": "user", "content": "step 4: add 4"}]},
]


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("per_source_eval")
    target = tiny_target(root / "target")
    model, tok = load_target(target)
    torch.manual_seed(5)
    save_drafter(DFlashDrafter(drafter_config(model, tok)), root / "ckpt")
    prompts = root / "eval_prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    recipe = make_recipe(target={"model": str(target), "precision": "fp32"},
                         stages={"eval": {"num_prompts": len(PROMPTS), "max_new_tokens": 8}})
    ctx = stage_context("eval", recipe, root / "run",
                        inputs={"train.checkpoint": root / "ckpt", "ingest.eval_prompts": prompts})
    result = eval_stage.run(ctx)
    report = ctx.out_dir / "report"
    return result, json.loads((report / "eval.json").read_text()), report


def test_eval_reports_tau_per_source_and_per_context_bucket(eval_run):
    result, data, _ = eval_run
    assert data["prompt_sources"] == ["math", "code", "math", "unknown"]
    assert data["prompt_tokens"][2] >= 512 > max(data["prompt_tokens"][i] for i in (0, 1, 3))
    for run in ("trained", "untrained"):
        s = data[run]
        assert list(s["by_source"]) == ["code", "math", "unknown"]
        assert [g["prompts"] for g in s["by_source"].values()] == [1, 2, 1]
        assert list(s["by_context"]) == ["<512", "512-2K"]  # only non-empty buckets, in length order
        assert [g["prompts"] for g in s["by_context"].values()] == [3, 1]
        for groups in (s["by_source"], s["by_context"]):
            # the same definition as overall: all cycles of the group's prompts
            assert sum(g["cycles"] for g in groups.values()) == s["cycles"]
            assert sum(g["tau"] * g["cycles"] for g in groups.values()) / s["cycles"] == pytest.approx(s["tau"])
            assert all(len(g["acceptance_by_position"]) == data["block_size"] - 1 for g in groups.values())
        assert s["by_source"]["code"]["tau"] == pytest.approx(s["per_prompt_tau"][1])
        assert s["by_context"]["512-2K"]["tau"] == pytest.approx(s["per_prompt_tau"][2])
    assert result.metrics["tau_by_source"] == {k: v["tau"] for k, v in data["trained"]["by_source"].items()}
    assert list(result.metrics["tau_by_context"]) == ["<512", "512-2K"]


def test_acceptance_plot_has_source_and_context_panels(eval_run):
    import matplotlib.image
    import matplotlib.pyplot as plt

    _, data, report = eval_run
    fig = acceptance_figure({"trained": data["trained"], "untrained": data["untrained"]})
    try:
        titles = [ax.get_title() for ax in fig.axes]
        assert titles == ["Acceptance per position", "Accepted length", SOURCE_PANEL, CONTEXT_PANEL]
        by_source = fig.axes[2]
        assert len(by_source.patches) == 2 * 3  # a trained and an untrained bar per source
        assert [t.get_text().split("\n")[0] for t in by_source.get_xticklabels()] == ["code", "math", "unknown"]
        assert len(fig.axes[3].patches) == 2 * 2
    finally:
        plt.close(fig)
    height, width = matplotlib.image.imread(report / "acceptance.png").shape[:2]
    assert height > 0.6 * width  # two rows of panels


def test_context_buckets():
    assert [context_bucket(n) for n in (0, 511, 512, 2047, 2048, 8191, 8192, 32767, 32768, 10**6)] == [
        "<512", "<512", "512-2K", "512-2K", "2K-8K", "2K-8K", "8K-32K", "8K-32K", ">=32K", ">=32K"]


def test_ingest_eval_prompts_keep_their_source(tmp_path):
    from dflashx.data.jsonl import iter_jsonl
    from dflashx.stages import ingest

    sources = []
    for name in ("math", "code"):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"prompt": f"{name} question {i}"}) + "\n" for i in range(10)))
        sources.append({"name": name, "path": str(path), "format": "prompt"})
    recipe = make_recipe(sources, dataset={"sources": sources, "eval_holdout": 8})
    ctx = stage_context("ingest", recipe, tmp_path / "run")
    ingest.run(ctx)
    held = list(iter_jsonl(ctx.out_dir / "eval_prompts.jsonl"))
    assert len(held) == 8 and all(r["source"] == r["messages"][0]["content"].split()[0] for r in held)


def _eval_json(run: Path, by_source: dict[str, tuple[float, float]] | None) -> None:
    """An eval.json with tau per source (trained, untrained); None: an old report without groups."""
    def side(i: int) -> dict:
        out = {"tau": 2.0 - i, "prompts": 3}
        if by_source is not None:
            out["by_source"] = {s: {"tau": taus[i], "prompts": 1} for s, taus in by_source.items()}
            out["by_context"] = {"<512": {"tau": 2.0 - i, "prompts": 3}}
        return out

    (run / "eval" / "report").mkdir(parents=True)
    (run / "eval" / "report" / "eval.json").write_text(json.dumps({"trained": side(0), "untrained": side(1)}))


def test_compare_shows_both_runs_tau_per_source(tmp_path):
    a, b, c = (make_run(tmp_path, name=n) for n in ("run-a", "run-b", "run-old"))
    _eval_json(a, {"math": (2.5, 1.0), "code": (1.5, 1.0)})
    _eval_json(b, {"math": (3.0, 1.0), "chat": (2.0, 1.1)})
    _eval_json(c, None)
    sections = compare([RunInfo.load(a), RunInfo.load(b), RunInfo.load(c)])
    section = next(s for s in sections if s.title == "Eval tau per source")
    rows = {row[0]: row[1:] for row in section.rows}
    assert list(rows) == ["overall", "chat", "code", "math"]
    assert rows["math"] == ["2.5 / 1 (1 prompts)", "3 / 1 (1 prompts)", "-"]
    assert rows["code"][1] == "-" and rows["chat"][0] == "-" and rows["chat"][1] == "2 / 1.1 (1 prompts)"
    assert rows["overall"] == ["2 / 1 (3 prompts)", "2 / 1 (3 prompts)", "-"]
    context = next(s for s in sections if s.title == "Eval tau by prompt length (tokens)")
    assert [row[0] for row in context.rows] == ["overall", "<512"]
    md = CliRunner().invoke(app, ["compare", str(a), str(b), "--markdown"])
    assert md.exit_code == 0 and "### Eval tau per source" in md.output
    assert "| math | 2.5 / 1 (1 prompts) | 3 / 1 (1 prompts) |" in md.output


def test_compare_without_eval_reports_says_so(tmp_path):
    a, b = make_run(tmp_path, name="a"), make_run(tmp_path, name="b")
    section = next(s for s in compare([RunInfo.load(a), RunInfo.load(b)]) if s.title == "Eval tau per source")
    assert section.rows == [] and "No run has an eval report" in section.note
