"""Recipes for the planner tests, built without the recipe loader (the planner takes a `Recipe`).

`seeds_recipe()` is recipes/qwen36_27b.yaml with its hardware profile inlined from
dflashx/hardware_profiles/; `tiny_recipe()` likewise for recipes/tiny.yaml. Keyword overrides use
dotted keys with `__` for dots: `seeds_recipe(stages__train__mode="offline")`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dflashx.config.schema import Recipe

REPO = Path(__file__).resolve().parents[1]


def profile(name: str) -> dict[str, Any]:
    return yaml.safe_load((REPO / "dflashx" / "hardware_profiles" / f"{name}.yaml").read_text())


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *path, last = dotted.split("__")
    for part in path:
        data = data.setdefault(part, {})
    data[last] = value


def recipe_from(file: str, hardware: str | None = None, **overrides: Any) -> Recipe:
    data = yaml.safe_load((REPO / "recipes" / file).read_text())
    data["hardware"] = profile(hardware or data["hardware"])
    for key, value in overrides.items():
        _set(data, key, value)
    return Recipe.model_validate(data)


def seeds_recipe(hardware: str = "rtx_pro_6000_x4", **overrides: Any) -> Recipe:
    return recipe_from("qwen36_27b.yaml", hardware, **overrides)


def tiny_recipe(**overrides: Any) -> Recipe:
    return recipe_from("tiny.yaml", None, **overrides)
