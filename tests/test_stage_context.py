"""Typed throughout the stages (issue 39): each stage's `run` takes the `StageContext` of its own resolved section,
so mypy checks every `ctx.config` read against that section's type, and the executor hands it that section."""

from __future__ import annotations

import typing

import pytest

from dflashx.config.schema import STAGE_ORDER
from dflashx.resolve.model import ResolvedStages
from dflashx.stages.base import StageContext, load_stage


@pytest.mark.parametrize("name", STAGE_ORDER)
def test_each_stage_runs_on_the_context_of_its_own_section(name: str) -> None:
    run = load_stage(name)
    ctx_type = typing.get_type_hints(run)["ctx"]
    assert typing.get_origin(ctx_type) is StageContext
    (section,) = typing.get_args(ctx_type)
    assert section is ResolvedStages.model_fields[name].annotation


def test_the_context_hands_the_stage_its_section(tmp_path) -> None:
    from helpers_models import make_recipe, stage_context

    for name in STAGE_ORDER:
        ctx = stage_context(name, make_recipe(), tmp_path)
        assert ctx.config is getattr(ctx.recipe.stages, name)
        assert isinstance(ctx.config, ResolvedStages.model_fields[name].annotation)
