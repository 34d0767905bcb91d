"""P10/P50/P90: from the mean output length's uncertainty (re-planned) and each model's error."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from _plan_recipes import REPO, seeds_recipe, tiny_recipe
from typer.testing import CliRunner

from dflashx.cli.main import app
from dflashx.plan.plan import make_plan
from dflashx.plan.ranges import GUESS_FACTOR, MODEL_ERROR, Z90

SEEDS = str(REPO / "recipes" / "qwen36_27b.yaml")


def seconds(plan: dict, stage: str) -> float:
    return next(s for s in plan["stages"] if s["name"] == stage)["estimates"]["seconds"]


def explain(plan: dict, key: str) -> dict:
    return next(t for t in plan["explain"] if t["key"] == key)


def test_a_guessed_mean_is_replanned_at_the_guess_band_and_widened_by_the_model():
    recipe = seeds_recipe(dataset__stats__output_tokens_mean_se=None)
    plan = make_plan(recipe).to_json(explain=True)
    mean = plan["ranges"]["output_tokens_mean"]
    assert (mean["p10"], mean["p90"]) == pytest.approx((1818 / GUESS_FACTOR, 1818 * GUESS_FACTOR))
    # the length scenarios are the same plan with every output length scaled
    longer = make_plan(seeds_recipe(dataset__stats__output_tokens_mean=1818 * GUESS_FACTOR,
                                    dataset__stats__output_tokens_mean_se=None)).to_json()
    term = explain(plan, "ranges.generate.seconds")
    assert term["inputs"]["length_p90"] == pytest.approx(seconds(longer, "generate"))
    band, mid = plan["ranges"]["stages"]["generate"]["seconds"], seconds(plan, "generate")
    up = math.hypot(math.log(seconds(longer, "generate") / mid), math.log(MODEL_ERROR["generate"][0]))
    assert band["p50"] == mid and band["p90"] == pytest.approx(mid * math.exp(up))
    assert "within a factor 1.5" in explain(plan, "ranges.output_tokens_mean")["inputs"]["source_of_range"]


def test_a_measured_mean_leaves_mostly_the_model_error():
    plan = make_plan(seeds_recipe(dataset__stats__output_tokens_mean_se=0.0)).to_json()
    r = plan["ranges"]
    gen, train = r["stages"]["generate"]["seconds"], r["stages"]["train"]["seconds"]
    assert gen["p90"] / gen["p50"] == pytest.approx(MODEL_ERROR["generate"][0])
    assert gen["p50"] / gen["p10"] == pytest.approx(MODEL_ERROR["generate"][0])
    assert train["p90"] / train["p50"] == pytest.approx(MODEL_ERROR["train"][0])
    ingest = r["stages"]["ingest"]["seconds"]
    assert ingest["p10"] == ingest["p50"] == ingest["p90"]  # no length, no model error
    # the seeds' recipe: a mean measured on all 902,087 completions (se 2 tokens)
    seeds = make_plan(seeds_recipe()).to_json()["ranges"]["output_tokens_mean"]
    assert seeds["p90"] - 1818 == pytest.approx(Z90 * 2)


def test_totals_combine_stages_and_cost_follows_time():
    plan = make_plan(seeds_recipe(dataset__stats__output_tokens_mean_se=None)).to_json()
    r, t = plan["ranges"], plan["totals"]
    total = r["totals"]["seconds"]
    assert total["p10"] < total["p50"] < total["p90"] and total["p50"] == pytest.approx(t["seconds"])
    rate = 4 * 1.80 / 3600
    assert r["totals"]["usd"]["p90"] == pytest.approx(total["p90"] * rate)
    assert r["totals"]["days"]["p90"] == pytest.approx(total["p90"] / 86_400)
    # independent stage errors: the total's spread is narrower than the sum of the stages' spreads
    stage_spread = sum(s["seconds"]["p90"] - s["seconds"]["p50"] for s in r["stages"].values())
    assert total["p90"] - total["p50"] < stage_spread


def test_truncation_moves_with_the_mean():
    plan = make_plan(tiny_recipe(stages__generate__max_tokens=64)).to_json(explain=True)
    share = plan["ranges"]["truncated_share"]
    assert share["p10"] < share["p50"] < share["p90"]
    term = explain(plan, "ranges.truncated_share")
    assert term["inputs"]["max_tokens"] == 64 and term["inputs"]["qc_limit"] == 0.05


def test_a_budget_between_p50_and_p90_is_a_warning():
    plan = make_plan(seeds_recipe(dataset__stats__output_tokens_mean_se=None)).to_json()
    days = plan["ranges"]["totals"]["days"]
    between = (days["p50"] + days["p90"]) / 2
    warned = make_plan(seeds_recipe(dataset__stats__output_tokens_mean_se=None, budget__max_days=between)).to_json()
    assert [w["code"] for w in warned["warnings"]].count("budget_days_p90") == 1 and not warned["errors"]
    above = make_plan(seeds_recipe(budget__max_days=days["p90"] * 1.1, dataset__stats__output_tokens_mean_se=None))
    assert "budget_days_p90" not in [w.code for w in above.warnings]


def test_ranges_in_the_table_and_the_json():
    runner = CliRunner()
    human = runner.invoke(app, ["plan", SEEDS, "--dry-run"], env={"COLUMNS": "200"})
    assert "P10 – P90" in human.output and "USD P10 – P90" in human.output
    data = json.loads(runner.invoke(app, ["plan", SEEDS, "--json"]).stdout)
    band = data["ranges"]["totals"]["days"]
    assert band["p10"] < data["totals"]["days"] < band["p90"]
    for stage in ("generate", "train"):
        assert set(data["ranges"]["stages"][stage]) == {"seconds", "usd"}
    assert f"{band['p10']:.1f} d – {band['p90']:.1f} d" in human.output


def test_the_generation_error_band_is_the_recorded_validation_table():
    """MODEL_ERROR['generate'] is read off benchmarks/results/planner_accuracy.json (the planner is
    pure, so it carries the figure): re-running the benchmark after a model change must update it."""
    rows = json.loads((REPO / "benchmarks" / "results" / "planner_accuracy.json").read_text())["rows"]
    generation = [r for r in rows if r["role"] == "validation" and r["unit"] not in ("s/step", "x (speed-up)", "GB")]
    logs = sorted(abs(math.log(r["predicted"] / r["measured"])) for r in generation)
    median = statistics.median(logs)
    sigma = median / 0.6744897501960817  # a log-normal's median |deviation| is 0.674 sigma
    assert MODEL_ERROR["generate"][0] == pytest.approx(math.exp(Z90 * sigma), abs=0.006)
    assert f"{len(generation)} generation rows" in MODEL_ERROR["generate"][1]
    assert f"{median:.3f}" in MODEL_ERROR["generate"][1]
