"""`dflashx compare RUN...` from the runs' local records, plan and manifest."""

from __future__ import annotations

import json
from pathlib import Path

from s3_fixtures import make_run
from typer.testing import CliRunner

from dflashx.cli.main import app
from dflashx.report.compare import compare, flatten
from dflashx.report.fmt import human_value
from dflashx.report.runinfo import RunInfo
from dflashx.track.records import RecordLog

runner = CliRunner()


def _two_runs(tmp_path: Path) -> tuple[Path, Path]:
    a, b = make_run(tmp_path, name="lr-low"), make_run(tmp_path, name="lr-high")
    plan = json.loads((b / "plan.json").read_text())  # the run's recipe is its plan's resolved one
    plan["resolved"]["stages"]["train"]["lr"] = 0.01
    (b / "plan.json").write_text(json.dumps(plan))
    RecordLog(b, "lr-high-1").append("stage_end", stage="train", stage_key="k2", duration_s=80.0,
                                     metrics={"loss": 0.75, "tokens_per_s": 1200.0})
    return a, b


def _table(sections: list, title: str) -> dict[str, list[str]]:
    section = next(s for s in sections if s.title == title)
    return {row[0]: row[1:] for row in section.rows}


def test_sections_show_differences_estimates_and_results(tmp_path: Path) -> None:
    a, b = _two_runs(tmp_path)
    sections = compare([RunInfo.load(a), RunInfo.load(b)])
    diff = _table(sections, "Recipe differences")
    assert diff["stages.train.lr"] == [human_value(RunInfo.load(a).recipe.stages.train.lr), "0.01"]
    assert diff["name"] == ["lr-low", "lr-high"]
    assert "storage.root" not in diff  # equal keys are left out
    assert _table(sections, "Time: actual / estimate")["train"] == ["1.3 min / 1.7 min (0.80x)"] * 2
    storage = _table(sections, "Storage: actual / estimate")
    assert storage["ingest"][0] == "1010 B / 1000 B (1.01x)" and storage["qc"][0] == "- / 0 B"  # qc: planned, off
    assert _table(sections, "Throughput (tokens/s)")["train"] == ["900", "1200"]
    results = _table(sections, "Key results")
    assert results["train.loss"] == ["1.25", "0.75"]


def test_cli_markdown_and_json(tmp_path: Path) -> None:
    a, b = _two_runs(tmp_path)
    md = runner.invoke(app, ["compare", str(a), str(b), "--markdown"])
    assert md.exit_code == 0, md.output
    assert "### Key results" in md.output and "| train.loss | 1.25 | 0.75 |" in md.output
    js = runner.invoke(app, ["compare", str(a), str(b), "--json"])
    titles = [s["title"] for s in json.loads(js.output)["sections"]]
    assert titles[0] == "Runs" and "Recipe differences" in titles
    assert runner.invoke(app, ["compare", str(a), str(tmp_path)]).exit_code == 2


def test_flatten_indexes_lists_of_mappings() -> None:
    assert flatten({"a": {"b": 1}, "s": [{"x": 2}], "ids": [1, 2]}) == {"a.b": 1, "s[0].x": 2, "ids": [1, 2]}


def test_the_recipe_compared_is_the_plans_not_recipe_yaml(tmp_path: Path) -> None:
    assert flatten({}) == {} and flatten({}, "r") == {"r": {}}  # an empty section below the top stays a value
    a, b = _two_runs(tmp_path)
    before = _table(compare([RunInfo.load(a), RunInfo.load(b)]), "Recipe differences")
    (b / "recipe.yaml").unlink()  # a copy for people: the typed plan holds the resolved recipe
    diff = _table(compare([RunInfo.load(a), RunInfo.load(b)]), "Recipe differences")
    assert diff == before and "" not in diff and diff["name"] == ["lr-low", "lr-high"]


def _eval_report(run: Path, report: dict) -> None:
    (run / "eval" / "report").mkdir(parents=True)
    (run / "eval" / "report" / "eval.json").write_text(json.dumps(report))


def test_compare_puts_every_suite_and_drafter_side_by_side(tmp_path: Path) -> None:
    """A run with suites and a baseline beside a run whose eval.json predates suites (its trained and
    untrained figures count as the one suite `heldout`)."""
    new, old = make_run(tmp_path, name="new"), make_run(tmp_path, name="old")
    summary = lambda tau, n: {"tau": tau, "prompts": n}  # noqa: E731
    _eval_report(new, {"suites": {"heldout": {"trained": summary(3.9, 16), "untrained": summary(1.0, 16),
                                              "z-lab": summary(4.2, 16)},
                                  "gsm8k": {"trained": summary(2.5, 8), "untrained": summary(1.0, 8),
                                            "z-lab": summary(3.1, 8)}}})
    _eval_report(old, {"trained": summary(3.5, 16), "untrained": summary(1.0, 16)})
    section = next(s for s in compare([RunInfo.load(new), RunInfo.load(old)])
                   if s.title == "Eval tau per suite and drafter")
    assert section.headers == ["suite", "drafter", "new", "old"]
    assert section.rows == [
        ["heldout", "trained", "3.9 (16 prompts)", "3.5 (16 prompts)"],
        ["heldout", "untrained", "1 (16 prompts)", "1 (16 prompts)"],
        ["heldout", "z-lab", "4.2 (16 prompts)", "-"],
        ["gsm8k", "trained", "2.5 (8 prompts)", "-"],
        ["gsm8k", "untrained", "1 (8 prompts)", "-"],
        ["gsm8k", "z-lab", "3.1 (8 prompts)", "-"],
    ]


def test_the_run_summary_shows_tau_per_suite_only_when_it_adds_something() -> None:
    from dflashx.report.console import HEADLINES, figures

    one = {"tau": 3.9, "tau_untrained": 1.0, "tau_by_suite": {"heldout": {"trained": 3.9, "untrained": 1.0}}}
    assert figures(one, HEADLINES["eval"]) == "τ 3.90 trained · vs 1.00 untrained"
    two = one | {"tau_by_suite": {"heldout": {"trained": 3.9, "untrained": 1.0, "z-lab": 4.25},
                                  "gsm8k": {"trained": 2.5, "untrained": 1.0, "z-lab": 3.0}}}
    assert figures(two, HEADLINES["eval"]) == ("τ 3.90 trained · vs 1.00 untrained · τ per suite: heldout "
                                               "3.90/1.00/4.25, gsm8k 2.50/1.00/3.00 (trained/untrained/z-lab)")


def test_one_flattener_for_reports_keys_and_calibration():
    """config.tree.flatten is the dotted-key flattener compare, the stage keys' leaves and the calibration
    conditions use; lists of mappings are walked, lists of scalars and caller-chosen leaves stay values."""
    from dflashx.config.tree import flatten

    tree = {"a": {"b": 1, "e": {}}, "l": [{"x": 2}], "s": [1, 2], "p": {"fingerprint": "f"}}
    assert flatten(tree) == {"a.b": 1, "a.e": {}, "l[0].x": 2, "s": [1, 2], "p.fingerprint": "f"}
    assert flatten(tree, "r", lambda n: isinstance(n, list) or "fingerprint" in n) == {
        "r.a.b": 1, "r.a.e": {}, "r.l": [{"x": 2}], "r.s": [1, 2], "r.p": {"fingerprint": "f"}}
