"""The trained drafter's predicted serving speed-up: in eval.json, the stage's figures and `dflashx compare`,
the plan's figure before training, and, on the CPU, against the measured speed-up of the in-process
speculative decoder over plain greedy decoding of the same tiny target."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
from _plan_recipes import seeds_recipe, tiny_recipe
from helpers_models import make_recipe
from s3_fixtures import make_run
from test_eval_stage import _ctx, setup  # noqa: F401 - the stage's fixture: a tiny target and a drafter
from test_spec_decode import PROMPT, build_drafter, build_target

from benchmarks.cpu_decode import greedy
from dflashx.dflash.acceptance import summarize
from dflashx.dflash.spec_decode import SpecDecoder
from dflashx.plan.estimates.deployment import expected_speedup, predict_speedup
from dflashx.plan.plan import make_plan
from dflashx.report.compare import compare
from dflashx.report.runinfo import RunInfo
from dflashx.resolve import resolve
from dflashx.stages import eval as eval_stage
from dflashx.stages import eval_speedup
from dflashx.targets.read_config import facts_from_config
from dflashx.targets.registry import lookup

QWEN36 = lookup("Qwen/Qwen3.6-27B")


def test_eval_writes_the_predicted_speedup_on_the_recipes_profile(setup, tmp_path):  # noqa: F811
    root, target, prompts = setup
    ctx = _ctx(tmp_path, target, {"train.checkpoint": root / "ckpt", "ingest.eval_prompts": prompts})
    result = eval_stage.run(ctx)
    report = ctx.out_dir / result.artifacts["report"].path
    data = json.loads((report / "eval.json").read_text())
    prediction = data["predicted_speedup"]
    assert prediction["profile"] == "cpu" and prediction["block_size"] == 4
    assert [r["concurrency"] for r in prediction["rows"]] == [1, 8, 32, 128]
    tau = 1 + sum(a or 0 for a in data["trained"]["acceptance_by_position"])
    assert prediction["tau"] == pytest.approx(tau) and "measured" in prediction["acceptance_source"]
    assert result.metrics["predicted_speedup_c1"] == prediction["rows"][0]["speedup"]
    assert result.metrics["predicted_speedup"].startswith(f"{prediction['rows'][0]['speedup']:.2f}x @1")
    assert (report / "speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_speedup_falls_with_concurrency_and_says_when_it_does_not_pay():
    recipe = resolve(seeds_recipe("h200_x1"), QWEN36)
    good = predict_speedup(recipe, [0.9] * 15, recipe.drafter.dims)
    speedups = [r.speedup for r in good.rows]
    assert speedups == sorted(speedups, reverse=True) and speedups[0] > 3 and all(r.pays for r in good.rows[:2])
    # 16 verified tokens keep 16 more linear-attention states per request: the drafter's batch is smaller
    assert good.rows[-1].batch_drafter < good.rows[-1].batch
    poor = predict_speedup(recipe, [0.3] + [0.0] * 14, recipe.drafter.dims)
    assert poor.rows[0].speedup > 1 > poor.rows[-1].speedup and not poor.rows[-1].pays


def test_the_plan_shows_the_speedup_at_the_expected_tau_before_training():
    plan = make_plan(seeds_recipe("h200_x1", deploy={"expected_tau": 3.0, "concurrencies": [1, 4]})).to_json(True)
    deploy = plan["deploy"]
    assert deploy["tau"] == pytest.approx(3.0) and [r["concurrency"] for r in deploy["rows"]] == [1, 4]
    term = next(t for t in plan["explain"] if t["key"] == "deploy.speedup")
    assert term["value"] == deploy["rows"][0]["speedup"] and "deploy.expected_tau" in term["source"]
    published = expected_speedup(resolve(seeds_recipe("h200_x1", drafter__architecture="dflash"), QWEN36))
    assert published.tau == pytest.approx(6.36) and "16818" in published.acceptance_source


def test_compare_shows_the_predicted_speedup_of_two_runs(tmp_path):
    tiny = make_plan(tiny_recipe()).resolved
    runs = []
    for name, share in (("weak", 0.2), ("strong", 0.8)):
        run = make_run(tmp_path, name=name)
        result = {"trained": {"acceptance_by_position": [share] * 7, "tau": 1 + 7 * share, "cycles": 10},
                  "prompts": 2, "block_size": 8}
        report = run / "eval" / "report"
        report.mkdir(parents=True)
        (report / "eval.json").write_text(json.dumps(eval_speedup.section(tiny, result)))
        runs.append(RunInfo.load(run))
    section = next(s for s in compare(runs) if s.title == "Predicted serving speed-up")
    table = {row[0]: row[1:] for row in section.rows}
    assert table["tau, profile"] == ["2.40 on cpu", "6.60 on cpu"]
    weak, strong = (float(cell.split("x")[0]) for cell in table["1 in flight"])
    assert strong > weak and "tok/s" in table["1 in flight"][0]


# ---------------------------------------------------------------------------------------------- CPU measurement
# Tolerance: the prediction within 35% of the measured speed-up (|ln ratio| <= ln 1.35). On the development
# machine the model is 3-10% (untrained, tau 1) and 13-17% (oracle, tau 3.9) above the measurement; a model
# that took the speed-up to be tau (verify and drafting free) is a factor 1.9-2.1 above it, and one that paid
# a plain step per verified token a factor 2.3 below it in the oracle case: the tolerance tells them apart.
TOLERANCE = math.log(1.35)


def _fastest(calls, repeats: int = 9) -> list[float]:
    """The fastest of `repeats` runs of each call, the calls taking turns. Both decoders run on this one
    thread (torch set to one), so their time is this thread's CPU time: neither other processes on a shared
    machine nor other threads of the test process (a full-suite run's leftover servers and pools, which
    the process's CPU time counted: one such run measured the untrained drafter at 0.35x, alone 0.46-0.49x)
    enter it."""
    best = [math.inf] * len(calls)
    for _ in range(repeats):
        for i, call in enumerate(calls):
            t0 = time.thread_time()
            call()
            best[i] = min(best[i], time.thread_time() - t0)
    return best


def _oracle(drafter, continuation: list[int], vocab: int):
    """The drafter's real forward is paid; its proposals are replaced by the target's continuation."""
    forward = drafter.draft_block

    def draft_block(ctx, anchor, embed, head, rows=None):
        forward(ctx, anchor, embed, head, rows)
        start = ctx.length - len(PROMPT)
        want = (continuation + [0] * drafter.config.block_size)[start + 1: start + drafter.config.block_size]
        return torch.nn.functional.one_hot(torch.tensor(want), vocab).float() * 10

    drafter.draft_block = draft_block


def test_the_cpu_prediction_matches_the_in_process_speculative_decoder():
    torch.set_num_threads(1)
    tokens, block = 48, 4
    target = build_target("qwen3")
    config = target.config.to_dict() | {"mask_token_id": target.config.vocab_size - 1}
    recipe = resolve(make_recipe(
        target={"model": "tiny", "precision": "fp32"},
        drafter={"num_layers": 1, "block_size": block, "num_target_layers": 2},
        dataset={"sources": [{"name": "s", "path": "x.jsonl"}],
                 "stats": {"prompt_tokens_mean": len(PROMPT), "output_tokens_mean": tokens,
                           "output_tokens_p90": tokens + 0.01}},
        stages={"generate": {"backend": "transformers", "max_tokens": tokens}}), facts_from_config(config, name="tiny"))
    reference = greedy(target, PROMPT, tokens)
    for label in ("untrained", "oracle"):
        drafter = build_drafter(target, block_size=block)
        if label == "oracle":
            _oracle(drafter, reference, target.config.vocab_size)
        decoder = SpecDecoder(target, drafter)
        result = decoder.generate(PROMPT, tokens)
        assert result.output_ids == reference
        plain, spec = _fastest([lambda: greedy(target, PROMPT, tokens),
                                lambda decoder=decoder: decoder.generate(PROMPT, tokens)])
        measured = plain / spec
        acceptance = summarize([result], block)["acceptance_by_position"]
        predicted = predict_speedup(recipe, acceptance, recipe.drafter.dims, concurrencies=[1]).rows[0].speedup
        assert abs(math.log(predicted / measured)) <= TOLERANCE, (label, predicted, measured)
        naive = 1 + sum(acceptance)
        assert abs(math.log(naive / measured)) > TOLERANCE, (label, naive, measured)
