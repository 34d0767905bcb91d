"""The drafter-architecture registry's own contract (issue 39): names and keys are unique, an unknown architecture
or drafter key gets a did-you-mean at its key, `dflashx schema` lists every architecture's keys, and a checkpoint's
`architectures` names exactly one."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from dflashx.cli.main import app
from dflashx.config import architectures
from dflashx.config.architectures import dflash, dflash2
from dflashx.config.errors import RecipeError
from dflashx.config.load import load_recipe
from _plan_recipes import REPO

TINY = REPO / "recipes" / "tiny.yaml"


def test_a_name_or_a_key_is_registered_once() -> None:
    with pytest.raises(ValueError, match="registered already"):
        architectures.register(dflash2.SPEC)
    clash = dataclasses.replace(dflash2.SPEC, name="dflash3", hf_name="DFlash3DraftModel")
    with pytest.raises(ValueError, match="belong to another architecture"):
        architectures.register(clash)
    assert architectures.names() == ["dflash", "dflash2"]


@pytest.mark.parametrize(("override", "key", "hint"), [
    ("drafter.architecture=dflsh2", "drafter.architecture", "did you mean 'dflash2'"),
    ("drafter.selectr_rank=8", "drafter", "did you mean 'selector_rank'"),
    ("drafter.selector_rank=0", "drafter", "drafter.selector_rank: Input should be greater than or equal to 1"),
])
def test_unknown_names_and_keys_say_what_was_meant(override: str, key: str, hint: str) -> None:
    with pytest.raises(RecipeError) as caught:
        load_recipe(TINY, [override])
    assert key in str(caught.value) and hint in str(caught.value)


def test_the_schema_lists_each_architectures_keys() -> None:
    result = CliRunner().invoke(app, ["schema"])
    assert result.exit_code == 0, result.output
    schema = json.loads(result.output)
    drafter = schema["$defs"]["DrafterSpec"]
    for spec in architectures.REGISTRY.values():
        assert spec.name in drafter["properties"]["architecture"]["description"]
        for key in spec.key_names():
            prop = drafter["properties"][key]
            assert prop["description"].startswith(f"(drafter.architecture: {spec.name})")
            assert prop["default"] == spec.keys.model_fields[key].default
    assert drafter["additionalProperties"] is False


def test_a_checkpoint_names_one_architecture() -> None:
    assert architectures.by_hf_name(["DFlash2DraftModel"]) is dflash2.SPEC
    assert architectures.by_hf_name(["DFlashDraftModel"]) is dflash.SPEC
    with pytest.raises(ValueError, match="expected one of"):
        architectures.by_hf_name(["EagleDraftModel"])
