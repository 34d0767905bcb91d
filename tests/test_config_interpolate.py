"""Recipe trees without OmegaConf: `${...}` interpolation, merging and dotted updates, YAML scalars as
recipes read them, and the errors a user sees for what is not supported."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflashx.config.errors import RecipeError
from dflashx.config.interpolate import InterpolationError, MissingValue, Interpolator
from dflashx.config.load import load_recipe
from dflashx.config.tree import ABSENT, merge, select, update
from dflashx.config.yaml_read import load_value, read_mapping

TREE = {
    "name": "r",
    "target": {"model": "Qwen/Qwen3-8B"},
    "hardware": {"gpus_per_node": 4},
    "dataset": {"sources": [{"name": "first"}, {"name": "second"}]},
    "a": "${b}", "b": "${a}",
}


def interpolate(value, tree=TREE):
    return Interpolator(tree).value(value)


def test_a_lone_reference_keeps_its_type_and_text_around_one_makes_a_string():
    assert interpolate("${hardware.gpus_per_node}") == 4
    assert interpolate("${hardware}") == {"gpus_per_node": 4}
    assert interpolate("${name}-${hardware.gpus_per_node}x") == "r-4x"
    assert interpolate("${dataset.sources.1.name}") == interpolate("${dataset.sources[1].name}") == "second"
    assert interpolate(r"cost \${not.a.key}") == "cost ${not.a.key}"


def test_environment_variables_and_their_defaults(monkeypatch):
    monkeypatch.setenv("DFLASHX_T_SET", "from-env")
    monkeypatch.delenv("DFLASHX_T_UNSET", raising=False)
    assert interpolate("${oc.env:DFLASHX_T_SET,ignored}") == "from-env"
    assert interpolate("${oc.env:DFLASHX_T_UNSET,https://s3.example.com:9000}") == "https://s3.example.com:9000"
    assert interpolate("${oc.env:DFLASHX_T_UNSET, 'quoted, with comma'}") == "quoted, with comma"
    assert interpolate("${oc.env:DFLASHX_T_UNSET,null}") is None
    assert interpolate("${oc.env:DFLASHX_T_UNSET,${target.model}}") == "Qwen/Qwen3-8B"
    with pytest.raises(InterpolationError, match="DFLASHX_T_UNSET") as info:
        interpolate("${oc.env:DFLASHX_T_UNSET}")
    assert info.value.env


@pytest.mark.parametrize(("value", "message"), [
    ("${target.modle}", "key 'target.modle' not found"),
    ("${a}", "interpolation cycle: a -> b -> a"),
    ("${oc.decode:1}", "unsupported resolver 'oc.decode'"),
    ("${name", "unclosed"),
    ("${dataset.sources.5.name}", "not found"),
])
def test_what_cannot_be_interpolated_says_why(value, message):
    with pytest.raises(InterpolationError, match=message):
        interpolate(value)


def test_a_required_value_left_unset():
    with pytest.raises(MissingValue):
        interpolate("???")


def test_merge_replaces_lists_and_values_and_merges_mappings():
    base = {"a": {"x": 1, "y": [1, 2]}, "b": 1}
    out = merge(base, {"a": {"y": [3], "z": None}, "c": 2})
    assert out == {"a": {"x": 1, "y": [3], "z": None}, "b": 1, "c": 2}
    assert base == {"a": {"x": 1, "y": [1, 2]}, "b": 1}  # inputs untouched


def test_update_adds_sections_merges_mappings_and_refuses_what_it_cannot_follow():
    tree = {"stages": {"train": {"lr": 1.0}}, "dataset": {"sources": [{"path": "a"}]}}
    update(tree, ("stages", "train", "epochs"), 2)
    update(tree, ("stages", "eval"), {"num_prompts": 3})
    update(tree, ("dataset", "sources", 0, "path"), "b")
    assert tree["stages"] == {"train": {"lr": 1.0, "epochs": 2}, "eval": {"num_prompts": 3}}
    assert select(tree, ("dataset", "sources", 0, "path")) == "b"
    assert select(tree, ("dataset", "sources", 3)) is ABSENT
    with pytest.raises(IndexError, match="out of range"):
        update(tree, ("dataset", "sources", 3, "path"), "c")
    with pytest.raises(TypeError):
        update(tree, ("stages", "train", "lr", "x"), 1)


def test_yaml_scalars_as_recipes_read_them(tmp_path: Path):
    assert load_value("1e-4") == pytest.approx(1e-4) and isinstance(load_value("6e-4"), float)
    assert load_value("2026-11-05") == "2026-11-05"  # a date stays text
    assert load_value("1_000") == 1000 and load_value("true") is True and load_value("[1, 2]") == [1, 2]
    f = tmp_path / "r.yaml"
    f.write_text("lr: 1e-4\nwhen: 2026-11-05\nanchor: &a {x: 1}\ncopy: *a\n")
    data, _ = read_mapping(f)
    assert data == {"lr": 1e-4, "when": "2026-11-05", "anchor": {"x": 1}, "copy": {"x": 1}}


def test_an_unsupported_resolver_in_a_recipe_names_the_file_key_and_forms(tmp_path: Path):
    f = tmp_path / "r.yaml"
    f.write_text("extends: " + str(Path(__file__).parent / "fixtures" / "bad_recipes" / "base.yaml") +
                 "\ndescription: ${oc.select:target.model}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(f)
    message = str(info.value)
    assert "r.yaml:2" in message and "description" in message
    assert "unsupported resolver 'oc.select'" in message and "${oc.env:NAME,default}" in message
