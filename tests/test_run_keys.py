"""Stage keys: which recipe changes re-run which stage."""

from __future__ import annotations

import pytest
import test_run_fakes as fakes

from pydantic import BaseModel

from dflashx.config.schema import STAGE_ORDER
from dflashx.resolve import ResolvedRecipe
from dflashx.run.keys import key_material, role, stage_key
from dflashx.stages.graph import GRAPH
from dflashx.store.manifest import Manifest
from helpers_models import resolved as resolve_for_test


@pytest.fixture
def source(tmp_path):
    return fakes.write_prompts(tmp_path / "prompts.jsonl")


def _keys(source, tmp_path, **changes) -> dict[str, str]:
    resolved = resolve_for_test(fakes.make_recipe(source, **changes))
    manifest = Manifest(tmp_path)
    return {s: stage_key(s, resolved, manifest).key for s in STAGE_ORDER}


def _changed(source, tmp_path, **changes) -> set[str]:
    base, new = _keys(source, tmp_path), _keys(source, tmp_path, **changes)
    return {s for s in STAGE_ORDER if base[s] != new[s]}


def test_every_stage_has_a_graph_entry():
    assert tuple(GRAPH) == STAGE_ORDER


def _unmarked(model: type[BaseModel], where: str) -> list[str]:
    """Fields under `model` with no stage-key marker (descending into OUTPUT sub-models)."""
    missing = []
    for name, info in model.model_fields.items():
        kind, dotted = role(info), f"{where}.{name}"
        if kind is None:
            missing.append(dotted)
        for sub in _models(info.annotation) if kind == "output" else ():
            missing += _unmarked(sub, dotted)
    return missing


def _models(annotation) -> list[type[BaseModel]]:
    from typing import get_args

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models(arg)]


def test_every_field_a_stage_key_reaches_declares_its_role():
    """A new field under any stage's key sections must say OUTPUT, OPERATIONAL or PATH."""
    missing = set()
    for spec in GRAPH.values():
        for section in spec.sections:
            owner: type[BaseModel] = ResolvedRecipe
            *parents, last = section.split(".")
            for part in parents:
                owner = _models(owner.model_fields[part].annotation)[0]
            info = owner.model_fields[last]
            subs = _models(info.annotation)
            if subs and (role(info) in (None, "output") or len(parents) == 0):
                missing.update(m for sub in subs for m in _unmarked(sub, section))
            elif not subs and role(info) is None:
                missing.add(section)
    assert sorted(missing) == []


@pytest.mark.parametrize(("change", "stages"), [
    ({"stages.train.lr": 1e-4}, {"train"}),
    ({"stages.generate.temperature": 0.7}, {"generate"}),
    ({"target.chat_template": {"enable_thinking": False}}, {"generate", "qc", "tokenize", "train", "eval"}),
    ({"drafter.block_size": 16}, {"qc", "tokenize", "train", "eval", "export"}),
    ({"dataset.shuffle_seed": 3}, {"ingest"}),
    # train's max_length is resolved from tokenize.max_length when unset (and its dataset changes anyway)
    ({"stages.tokenize.max_length": 512}, {"tokenize", "train"}),
    ({"stages.export.dtype": "fp32"}, {"export"}),
    # suites and baselines decide what eval measures; a built-in name enters as its whole definition
    ({"stages.eval.suites": ["heldout", "gsm8k"]}, {"eval"}),
    ({"stages.eval.baselines": []}, {"eval"}),
    # how the drafter will be served decides what eval measures (its sampled runs)
    ({"deploy.temperature": 0.6}, {"eval"}),
])
def test_config_changes_touch_only_their_stages(source, tmp_path, change, stages):
    assert _changed(source, tmp_path, **change) == stages


@pytest.mark.parametrize("change", [
    {"hardware": fakes.OTHER_HW},
    {"stages.generate.concurrency": 8, "stages.generate.urls": ["http://127.0.0.1:30000"],
     "stages.generate.retries": 1},
    {"stages.tokenize.num_proc": 4},
    {"stages.train.micro_batch": 4, "stages.train.zero_stage": 1, "stages.train.log_every": 1},
    {"tracking.mode": "offline", "budget.max_usd": 10},
    {"dataset.stats": {"samples": 10}},
    # the predicted speed-up's concurrencies, and seeds that a greedy deployment does not decode
    {"deploy.concurrencies": [1, 2], "stages.eval.sampling_seeds": 3},
])
def test_operational_changes_touch_nothing(source, tmp_path, change):
    assert _changed(source, tmp_path, **change) == set()


def test_disabling_a_stage_keeps_its_key(source, tmp_path):
    assert _changed(source, tmp_path, **{"stages.generate.enabled": False}) == set()


def test_local_paths_are_keyed_by_content(source, tmp_path):
    material = key_material("ingest", resolve_for_test(fakes.make_recipe(source)), {})
    path_value = material["config"]["dataset"]["sources"][0]["path"]
    assert set(path_value) == {"fingerprint"}
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(source.read_bytes())
    assert _keys(source, tmp_path)["ingest"] == _keys(copy, tmp_path)["ingest"]
    copy.write_text(source.read_text() + "\n")
    assert _keys(source, tmp_path)["ingest"] != _keys(copy, tmp_path)["ingest"]


def test_suite_and_baseline_paths_are_keyed_by_content(source, tmp_path):
    suite, drafter = tmp_path / "suite.jsonl", tmp_path / "drafter"
    suite.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")
    changes = {"stages.eval.suites": [{"name": "mine", "path": str(suite)}],
               "stages.eval.baselines": [{"name": "theirs", "path": str(drafter)}]}
    material = key_material("eval", resolve_for_test(fakes.make_recipe(source, **changes)), {})["config"]
    assert set(material["stages.eval"]["suites"][0]["path"]) == {"fingerprint"}
    assert set(material["stages.eval"]["baselines"][0]["path"]) == {"fingerprint"}
    before = _keys(source, tmp_path, **changes)
    (drafter / "config.json").write_text('{"changed": 1}')
    after = _keys(source, tmp_path, **changes)
    assert {s for s in STAGE_ORDER if before[s] != after[s]} == {"eval"}


def test_inputs_enter_the_key(source, tmp_path):
    resolved = resolve_for_test(fakes.make_recipe(source))
    manifest = Manifest(tmp_path)
    missing = stage_key("generate", resolved, manifest)
    assert missing.missing == ["ingest.prompts"] and missing.inputs == {}
    (tmp_path / "ingest").mkdir()
    (tmp_path / "ingest" / "p.jsonl").write_text("a\n")
    manifest.register("ingest", "prompts", "ingest/p.jsonl", "irreplaceable")
    first = stage_key("generate", resolved, manifest)
    (tmp_path / "ingest" / "p.jsonl").write_text("b\n")
    manifest.register("ingest", "prompts", "ingest/p.jsonl", "irreplaceable")
    second = stage_key("generate", resolved, manifest)
    assert first.missing == [] and first.key != second.key and first.key != missing.key
    backup = stage_key("backup", resolved, manifest)
    assert backup.inputs == {"ingest.prompts": manifest.entries["ingest.prompts"].sha256}


def _planned_keys(*overrides: str) -> dict[str, str]:
    from dflashx.cli._common import target_facts
    from dflashx.config.load import load_recipe
    from dflashx.plan.plan import make_plan

    loaded = load_recipe(fakes.REPO / "recipes" / "qwen36_27b.yaml", overrides)
    resolved = make_plan(loaded.recipe, target_facts(loaded.recipe)).resolved
    return {s: stage_key(s, resolved, Manifest(fakes.REPO / "no-such-run")).key for s in STAGE_ORDER}


def test_real_plan_hardware_switch_keeps_every_key():
    """The planner's derived values (micro batch, ZeRO stage, grad accumulation) follow the hardware;
    none of them may enter a key: moving the seeds' project to B200s must not regenerate."""
    base = _planned_keys()
    assert _planned_keys("hardware=b200_nvl8") == base
    lr = _planned_keys("train.lr=1e-4")
    assert {s for s in STAGE_ORDER if lr[s] != base[s]} == {"train"}
