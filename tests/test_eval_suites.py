"""Eval suites: recipe keys and their errors, resolution of built-in names, and reading a suite's
prompts from a file or through `datasets.load_dataset`.

The built-in benchmarks are checked against the z-lab reference's benchmark script (PyPI `dflash`
0.1.0, `dflash/benchmark.py`, read from the unpacked wheel): the same hub ids, configurations and
splits, the same user-turn text, the same prompts picked. The hub cannot be reached here, so the
records are local files with the benchmarks' field names, read through the same code paths (a
`path` suite, and an `hf_id` suite naming a local Parquet folder, which `load_dataset` reads as it
reads a hub dataset)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_reference import zlab_reference
from helpers_models import make_recipe, resolved

from dflashx.config.eval_suites import BENCHMARKS
from dflashx.config.errors import RecipeError
from dflashx.config.load import load_recipe
from dflashx.data.suites import suite_prompts
from dflashx.config.speculative import DeploySpec
from dflashx.resolve.suites import resolve_eval

# ours -> the z-lab script's DATASETS key (Alpaca is in the paper, not in the script)
ZLAB_NAMES = {"gsm8k": "gsm8k", "math500": "math500", "humaneval": "humaneval", "mbpp": "mbpp",
              "mt-bench": "mt-bench"}
# each benchmark's records as the hub holds them (the fields the prompts are written from)
ROWS = {
    "gsm8k": lambda i: {"question": f"Tom has {i} apples. How many?", "answer": str(i)},
    "math500": lambda i: {"problem": f"Solve x + {i} = 0.", "answer": str(-i)},
    "humaneval": lambda i: {"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    \"\"\"Return x.\"\"\"\n"},
    "mbpp": lambda i: {"task_id": i, "prompt": f"Write a function that adds {i}.", "test_list": ["assert 1"]},
    "mt-bench": lambda i: {"prompt": [f"Write a poem about {i}.", "Now shorter."], "category": "writing"},
    "alpaca": lambda i: {"instruction": f"Explain {i}.", "input": "" if i % 2 else f"context {i}", "output": "x"},
}


def _stage(**eval_cfg):
    return resolved(make_recipe(stages={"eval": eval_cfg})).stages.eval


def _parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_builtin_benchmarks_are_the_datasets_the_zlab_script_loads():
    script = zlab_reference("dflash.benchmark")
    stage = _stage(num_prompts=20, suites=["heldout", *BENCHMARKS], baselines=["untrained"])
    suites = {s.name: s for s in stage.suites}
    for ours, theirs in ZLAB_NAMES.items():
        spec = script.DATASETS[theirs]
        hub = (suites[ours].hf_id, suites[ours].hf_config) if suites[ours].hf_config else (suites[ours].hf_id,)
        assert hub == spec["load_args"] and suites[ours].split == spec["load_kwargs"]["split"], ours
    assert (suites["alpaca"].hf_id, suites["alpaca"].split) == ("tatsu-lab/alpaca", "train")
    assert suites["heldout"].heldout and not suites["gsm8k"].heldout
    assert all(s.count == 20 for s in stage.suites) and stage.decodes == 7 * 20 * 2


def test_a_suite_naming_a_builtin_overrides_only_what_it_writes(tmp_path):
    local = str(tmp_path / "gsm8k_test.parquet")
    stage = _stage(num_prompts=8, suites=[{"name": "heldout", "count": 3}, {"name": "gsm8k", "path": local},
                                          {"name": "mt-bench", "count": 5, "split": "train"}],
                   baselines=["untrained", {"name": "z", "path": str(tmp_path)}])
    heldout, gsm8k, mt = stage.suites
    assert heldout.count == 3 and heldout.heldout
    # its own file replaces the hub location; template and sampling stay the built-in's
    assert (gsm8k.path, gsm8k.hf_id, gsm8k.hf_config) == (local, None, None)
    assert gsm8k.template == BENCHMARKS["gsm8k"]["template"] and gsm8k.sample_seed == 42 and gsm8k.count == 8
    assert (mt.hf_id, mt.count) == ("HuggingFaceH4/mt_bench_prompts", 5)
    assert stage.decodes == (3 + 8 + 5) * 3
    # resolving is done once: a resolved stage resolves to itself (greedy deployment: make_recipe's)
    assert resolve_eval(stage, DeploySpec()) == stage


@pytest.mark.parametrize("ours", [*ZLAB_NAMES, "alpaca"])
def test_builtin_prompts_are_written_and_picked_as_the_zlab_script_does(tmp_path, ours):
    script = zlab_reference("dflash.benchmark")
    rows = [ROWS[ours](i) for i in range(12)]
    stage = _stage(num_prompts=5, suites=[{"name": ours, "path": str(_parquet(tmp_path / f"{ours}.parquet", rows))}])
    prompts = suite_prompts(stage.suites[0], None)
    got = [p["messages"] for p in prompts]
    assert all(len(m) == 1 and m[0]["role"] == "user" for m in got)
    if ours in ZLAB_NAMES:
        spec = script.DATASETS[ZLAB_NAMES[ours]]
        picked = script._select_dataset(rows, 5)  # random.Random(42) over the record order
        texts = [spec["format"](r)[0] if spec.get("multi_turn") else spec["format"](r) for r in picked]
    else:  # alpaca: the instruction, then the input when there is one
        picked = script._select_dataset(rows, 5)
        texts = [f"{r['instruction']}\n\n{r['input']}" if r["input"] else r["instruction"] for r in picked]
    assert [m[0]["content"] for m in got] == texts
    assert [p["id"] for p in prompts] == [f"{ours}#{rows.index(r)}" for r in picked]
    assert {p["source"] for p in prompts} == {ours}


def test_a_datasets_id_suite_reads_through_load_dataset(tmp_path, monkeypatch):
    """`hf_id` goes to `datasets.load_dataset(hf_id, hf_config, split=..., streaming=True)`, as a hub id
    would; here it names a local folder of Parquet files (offline: the hub is never asked)."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    folder = tmp_path / "hub-copy"
    _parquet(folder / "data" / "test-00000-of-00001.parquet", [{"question": f"q{i}"} for i in range(6)])
    _parquet(folder / "data" / "train-00000-of-00001.parquet", [{"question": "not this split"}])
    stage = _stage(suites=[{"name": "local", "hf_id": str(folder), "split": "test", "template": "{question}?",
                            "count": 4}])
    prompts = suite_prompts(stage.suites[0], None)
    assert [p["messages"][0]["content"] for p in prompts] == ["q0?", "q1?", "q2?", "q3?"]
    assert [p["id"] for p in prompts] == ["local#0", "local#1", "local#2", "local#3"]


def test_file_suites_keep_record_ids_and_sources_and_take_the_first_count(tmp_path):
    lines = [{"id": f"r{i}", "source": "tiny/add", "messages": [{"role": "user", "content": f"add {i}"}]}
             for i in range(5)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    suite = _stage(suites=[{"name": "mine", "path": str(path), "count": 2}]).suites[0]
    assert suite_prompts(suite, None) == [{"id": "r0", "source": "tiny/add", "messages": lines[0]["messages"]},
                                          {"id": "r1", "source": "tiny/add", "messages": lines[1]["messages"]}]


def test_suite_read_errors_name_the_recipe_item_the_record_and_the_fix(tmp_path):
    path = _parquet(tmp_path / "qa.parquet", [{"question": "a"}, {"title": "b"}])
    suite = _stage(suites=[{"name": "qa", "path": str(path), "template": "{question}"}]).suites[0]
    with pytest.raises(ValueError, match=r"qa\.parquet#row 1: template '\{question\}' cannot read 'question'.*"
                                         r"stages\.eval\.suites\[qa\]"):
        suite_prompts(suite, None)
    missing = _stage(suites=[{"name": "gone", "path": str(tmp_path / "gone.jsonl")}]).suites[0]
    with pytest.raises(ValueError, match=r"does not exist \(fix stages\.eval\.suites\[gone\]\.path\)"):
        suite_prompts(missing, None)
    heldout = _stage().suites[0]
    with pytest.raises(ValueError, match=r"stages\.eval\.prompts.*or drop `heldout` from stages\.eval\.suites"):
        suite_prompts(heldout, None)


def _recipe(tmp_path: Path, eval_yaml: str) -> Path:
    path = tmp_path / "sub" / "r.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"extends: {Path(__file__).resolve().parents[1] / 'recipes' / 'tiny.yaml'}\n"
                    f"stages:\n  eval:\n{eval_yaml}")
    return path


def test_recipe_suites_and_baselines_errors_name_file_line_and_fix(tmp_path):
    path = _recipe(tmp_path, "    suites: [heldout, gsm8, {name: mine}, {name: q, path: a.jsonl, template: '{a.b}'}]\n"
                             "    baselines: [untrained, {name: trained, path: x}, untrained]\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    text = err.value.format()
    assert "r.yaml:4: stages.eval.suites[1]" in text and "unknown built-in suite 'gsm8' (did you mean 'gsm8k'?)" in text
    assert "unknown built-in suite 'mine'" in text and "or give it a `path` (local file) or an `hf_id`" in text
    assert "template '{a.b}' must name record fields" in text
    assert "r.yaml:5: stages.eval.baselines" in text and "baseline names must be unique; ['untrained']" in text


def test_recipe_paths_of_suites_and_baselines_resolve_against_the_recipe(tmp_path):
    (tmp_path / "sub" / "drafter").mkdir(parents=True)
    path = _recipe(tmp_path,
                   "    suites: [heldout, {name: mine, path: data/p.jsonl},\n"
                   "             {name: tiny, path: builtin:tiny-eval-prompts}]\n"
                   "    baselines: [{name: local, path: drafter}, {name: hub, path: z-lab/Qwen3.6-27B-DFlash}]\n")
    stage = load_recipe(path).recipe.stages.eval
    assert stage.suites[1].path == str(tmp_path / "sub" / "data" / "p.jsonl")
    assert stage.suites[2].path == "builtin:tiny-eval-prompts"
    assert [b.path for b in stage.baselines] == [str(tmp_path / "sub" / "drafter"), "z-lab/Qwen3.6-27B-DFlash"]


def test_the_tiny_recipes_second_suite_is_the_tiny_corpus_eval_split():
    stage = resolved(load_recipe(Path(__file__).resolve().parents[1] / "recipes" / "tiny.yaml").recipe).stages.eval
    assert [s.name for s in stage.suites] == ["heldout", "tiny-eval"]
    assert [b.name for b in stage.baselines] == ["untrained"]
    prompts = suite_prompts(stage.suites[1], None)
    assert len(prompts) == 16 and len({p["id"] for p in prompts}) == 16
    # every family of the corpus, none of them a generation (training) prompt
    families = ("add", "sort", "reverse", "convert", "count", "case")
    assert {p["source"] for p in prompts} == {f"tiny/{f}" for f in families}
    assert all(p["id"].startswith("tiny-eval-") for p in prompts)


def test_trained_is_reserved_for_the_runs_own_drafter():
    from pydantic import ValidationError

    from dflashx.config.schema import EvalStage

    with pytest.raises(ValidationError, match="baseline name 'trained' is reserved"):
        EvalStage(baselines=[{"name": "trained", "path": "/some/folder"}])
    with pytest.raises(ValidationError, match="'untrained' is built in"):
        EvalStage(baselines=[{"name": "untrained", "path": "/some/folder"}])
