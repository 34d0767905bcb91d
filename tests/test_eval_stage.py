"""The eval stage through its contract: a tiny random Qwen3 target on disk, a drafter checkpoint,
held-out prompts as JSONL; real speculative decoding, eval.json and acceptance.png written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers_dflash import drafter_config, load_target, tiny_target
from helpers_models import make_recipe, stage_context

from dflashx.dflash.checkpoint import save_drafter
from dflashx.dflash.model import DFlashDrafter
from dflashx.stages import eval as eval_stage

PROMPTS = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"add {i} and {i + 3}"}]} for i in range(5)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    path = tiny_target(root / "target")
    model, tok = load_target(path)
    torch.manual_seed(5)
    save_drafter(DFlashDrafter(drafter_config(model, tok)), root / "ckpt")
    prompts = root / "eval_prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return root, path, prompts


def _ctx(tmp_path: Path, target: Path, inputs: dict, logs: list | None = None, precision: str = "fp32",
         deploy: dict | None = None, **eval_cfg):
    recipe = make_recipe(target={"model": str(target), "precision": precision}, deploy=deploy or {},
                         stages={"eval": {"num_prompts": 3, "max_new_tokens": 12} | eval_cfg})
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    log = (lambda m, step=None: logs.append(m)) if logs is not None else None
    return stage_context("eval", recipe, run_dir, inputs=inputs, log=log)


def test_eval_reports_tau_for_trained_and_untrained_drafters(setup, tmp_path):
    root, target, prompts = setup
    logs: list = []
    ctx = _ctx(tmp_path, target, {"train.checkpoint": root / "ckpt", "ingest.eval_prompts": prompts}, logs)
    result = eval_stage.run(ctx)
    report = ctx.out_dir / result.artifacts["report"].path
    data = json.loads((report / "eval.json").read_text())
    assert data["prompts"] == 3 and data["prompt_ids"] == ["p0", "p1", "p2"] and data["block_size"] == 4
    for run in ("trained", "untrained"):
        s = data[run]
        assert s["cycles"] == sum(s["accept_length_histogram"]) > 0
        hist = s["accept_length_histogram"]
        assert s["accepted_plus_one"] == pytest.approx(sum((n + 1) * c for n, c in enumerate(hist)) / s["cycles"])
        # the reference's count: tokens after each prompt's first (prefill) token, per cycle
        assert s["tau"] == pytest.approx((s["generated_tokens"] - s["prompts"]) / s["cycles"])
        assert s["tau"] <= s["accepted_plus_one"]
        assert len(s["acceptance_by_position"]) == 3 and len(s["per_prompt_tau"]) == 3
        assert 0 < s["generated_tokens"] <= 3 * 12 and s["tokens_per_s"] > 0
        # prompts without a source are "unknown"; short prompts are all in the first bucket
        for groups in (s["by_source"], s["by_context"]):
            assert len(groups) == 1
            assert next(iter(groups.values())) == {k: s[k] for k in next(iter(groups.values()))}
        assert list(s["by_source"]) == ["unknown"] and list(s["by_context"]) == ["<512"]
    # greedy: with either drafter the output is the target's own greedy output
    assert data["greedy_agreement"] == 1.0 and result.metrics["greedy_agreement"] == 1.0
    assert result.metrics["tau"] == data["trained"]["tau"]
    assert result.metrics["tau_untrained"] == data["untrained"]["tau"]
    assert (report / "acceptance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sum("eval/trained_tau" in m for m in logs) == 3


def test_recipe_prompts_file_wins_and_bad_lines_are_named(setup, tmp_path):
    root, target, _ = setup
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(PROMPTS[0]) + "\n" + json.dumps({"id": "x", "prompt": "hi"}) + "\n")
    ctx = _ctx(tmp_path, target, {"train.checkpoint": root / "ckpt"}, prompts=str(bad))
    with pytest.raises(ValueError, match=r"bad.jsonl:2: key `messages` missing"):
        eval_stage.run(ctx)


def test_eval_without_prompts_says_how_to_get_them(setup, tmp_path):
    root, target, _ = setup
    ctx = _ctx(tmp_path, target, {"train.checkpoint": root / "ckpt"})
    with pytest.raises(ValueError, match=r"stages\.eval\.prompts"):
        eval_stage.run(ctx)


def test_drafter_for_another_target_is_refused(setup, tmp_path):
    root, _, prompts = setup
    other = tiny_target(tmp_path / "other", layers=6)
    ctx = _ctx(tmp_path, other, {"train.checkpoint": root / "ckpt", "ingest.eval_prompts": prompts})
    with pytest.raises(ValueError, match="does not fit target"):
        eval_stage.run(ctx)


def test_a_sampled_deployment_is_measured_greedily_and_over_seeds_at_its_temperature(setup, tmp_path, monkeypatch):
    """deploy.temperature > 0: every suite and drafter decoded greedily (the figures as before, exact) and the
    trained drafter stages.eval.sampling_seeds times at the serving settings (the baselines stay greedy), the
    seeds' runs as one batch; the sampled tau is the mean over the seeds with its standard error, and the
    predicted speed-up reads the sampled acceptance."""
    import statistics

    from dflashx.dflash.batch_decode import BatchDecoder

    root, target, prompts = setup
    logs: list = []
    ctx = _ctx(tmp_path, target, {"train.checkpoint": root / "ckpt", "ingest.eval_prompts": prompts}, logs,
               deploy={"temperature": 0.8, "top_p": 0.9, "top_k": 20}, sampling_seeds=3)
    assert ctx.config.sampled_runs == 3 and ctx.config.decodes == 3 * (2 + 3)
    batches: list[tuple[int, float]] = []  # a spy on the real decoder: (rows, temperature) per batch
    generate = BatchDecoder.generate
    monkeypatch.setattr(BatchDecoder, "generate", lambda self, rows, *a, **kw: (
        batches.append((len(rows), kw.get("temperature", 0.0))), generate(self, rows, *a, **kw))[1])
    result = eval_stage.run(ctx)
    assert batches == [(3, 0.0), (3 * 3, 0.8), (3, 0.0)]  # trained greedy, its 3 seeds at once; untrained
    data = json.loads((ctx.out_dir / "report" / "eval.json").read_text())
    timed = data["decode_batches"]  # what the GPU price counts: each batch's cycles, those of its longest row
    assert [(b["drafter"], b["sampled"], b["rows"]) for b in timed] == [
        ("trained", False, 3), ("trained", True, 9), ("untrained", False, 3)]
    greedy = data["suites"]["heldout"]["untrained"]
    assert timed[2]["cycles"] <= greedy["cycles"] and all(b["seconds"] > 0 for b in timed)
    assert data["sampling"] == {"temperature": 0.8, "top_p": 0.9, "top_k": 20, "seeds": 3}
    assert data["greedy_agreement"] == 1.0 and result.metrics["greedy_agreement"] == 1.0  # the greedy run is exact
    assert sum("eval/trained_tau" in m for m in logs) == 3 and sum("eval/trained_tau_sampled" in m for m in logs) == 9
    assert sum("eval/untrained_tau" in m for m in logs) == 3
    assert not any("eval/untrained_tau_sampled" in m for m in logs)
    assert logs[-1]["eval/decoded"] == logs[-1]["eval/decodes"] == 3 * (2 + 3)
    assert "sampled" not in data["untrained"] and "sampled" not in data["suites"]["heldout"]["untrained"]
    for drafter in ("trained",):
        s = data[drafter]["sampled"]
        assert s["seeds"] == len(s["tau_per_seed"]) == 3 and all(t >= 1.0 for t in s["tau_per_seed"])
        assert s["tau"] == pytest.approx(statistics.mean(s["tau_per_seed"]))
        assert s["tau_se"] == pytest.approx(statistics.stdev(s["tau_per_seed"]) / 3 ** 0.5)
        half = 4.303 * s["tau_se"]  # Student's t, 97.5%, 2 degrees of freedom (3 seeds)
        assert s["tau_ci95"] == pytest.approx([s["tau"] - half, s["tau"] + half])
        assert s["cycles"] == sum(s["accept_length_histogram"]) > 0
        assert data["suites"]["heldout"][drafter]["sampled"] == s
    assert result.metrics["tau_sampled"] == data["trained"]["sampled"]["tau"]
    assert result.metrics["tau_sampled_text"].startswith(f"τ {data['trained']['sampled']['tau']:.2f} ± ")
    assert "at temperature 0.8" in result.metrics["tau_sampled_text"]
    prediction, served = data["predicted_speedup"], data["trained"]["sampled"]["acceptance_by_position"]
    assert prediction["tau"] == pytest.approx(1 + sum(a or 0 for a in served))
    assert "temperature 0.8" in prediction["acceptance_source"]


def test_a_greedy_deployment_has_no_sampled_runs(setup, tmp_path):
    root, target, prompts = setup
    ctx = _ctx(tmp_path, target, {"train.checkpoint": root / "ckpt", "ingest.eval_prompts": prompts},
               deploy={"top_p": 0.9}, sampling_seeds=3)
    assert ctx.config.sampled_runs == 0 and ctx.config.decodes == 3 * 2
    result = eval_stage.run(ctx)
    data = json.loads((ctx.out_dir / "report" / "eval.json").read_text())
    assert data["sampling"] is None and "sampled" not in data["trained"] and "tau_sampled" not in result.metrics
    assert "greedy" in data["predicted_speedup"]["acceptance_source"]


def test_fp8_target_is_evaluated_in_fp8_and_decoding_stays_exact(setup, tmp_path):
    """`target.precision: fp8`: the target's linears run in FP8 (row-wise scales, so a verify forward
    over a block gives each token what a one-token step would) and decoding equals its greedy output."""
    from dflashx.dflash.fp8 import FP8Linear

    root, target, prompts = setup
    ctx = _ctx(tmp_path, target, {"train.checkpoint": root / "ckpt", "ingest.eval_prompts": prompts}, precision="fp8")
    loaded, _ = eval_stage._load_target(ctx)
    assert sum(isinstance(m, FP8Linear) for m in loaded.modules()) == 4 * 7
    data = json.loads((ctx.out_dir / eval_stage.run(ctx).artifacts["report"].path / "eval.json").read_text())
    assert data["greedy_agreement"] == 1.0 and data["trained"]["cycles"] > 0


def test_the_sampled_interval_covers_95_percent_at_few_seeds():
    """`t975` is Student's quantile (table values, and the expansion beyond the table within 0.001 of
    published ones), and the interval it gives over 2 and 5 seeds covers the true mean about 95% of the time
    (seeded draws from a normal law, 4,000 trials each), where the normal 1.96 covers ~70% and ~88%."""
    import random
    import statistics

    from dflashx.dflash.acceptance import t975

    assert (t975(1), t975(4), t975(30)) == (12.706, 2.776, 2.042)
    for df, published in ((40, 2.021), (60, 2.000), (120, 1.980)):
        assert t975(df) == pytest.approx(published, abs=1e-3)
    rng = random.Random(0)
    for n, normal_covers in ((2, 0.70), (5, 0.88)):
        hits = naive = 0
        for _ in range(4000):
            draws = [rng.gauss(3.0, 0.2) for _ in range(n)]
            mean, se = statistics.fmean(draws), statistics.stdev(draws) / n ** 0.5
            hits += abs(mean - 3.0) <= t975(n - 1) * se
            naive += abs(mean - 3.0) <= 1.96 * se
        assert 0.94 <= hits / 4000 <= 0.96, (n, hits)
        assert naive / 4000 == pytest.approx(normal_covers, abs=0.03)
