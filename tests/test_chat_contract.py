"""One thinking contract end to end: a stage whose input was rendered with another chat template or
thinking mode than the recipe's stops before it spends anything, naming both."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflashx.data import chat_contract
from dflashx.data.chat_contract import ChatContract, ContractMismatch
from dflashx.stages import train as train_stage
from dflashx.stages.base import StageFailed
from helpers_dflash import tiny_dataset, tiny_target
from helpers_models import make_recipe, stage_context


def test_contracts_compare_template_thinking_and_kwargs(tmp_path):
    on = ChatContract.of("{{ messages }}", True, {})
    assert on == ChatContract.of("{{ messages }}", True, {})
    assert on != ChatContract.of("{{ messages }}", False, {})
    assert on != ChatContract.of("{{ messages }} ", True, {})
    assert on != ChatContract.of("{{ messages }}", True, {"tools": True})
    chat_contract.check(on, tmp_path, "x")  # nothing recorded: nothing to compare
    chat_contract.write(tmp_path, on)
    chat_contract.check(on, tmp_path, "x")
    with pytest.raises(ContractMismatch,
                       match=r"rendered with .*enable_thinking=True, but this recipe .*enable_thinking=False"):
        chat_contract.check(ChatContract.of("{{ messages }}", False, {}), tmp_path, "tokenize.dataset")


def _train_ctx(tmp_path: Path, thinking: bool):
    target = tiny_target(tmp_path / "target")
    data = tiny_dataset(tmp_path / "data", n=8)
    recipe = make_recipe(target={"model": str(target), "precision": "fp32",
                                 "chat_template": {"enable_thinking": thinking}},
                         drafter={"num_layers": 1, "block_size": 4, "target_layer_ids": [1, 2]},
                         stages={"train": {"max_steps": 1, "global_batch": 2, "micro_batch": 1, "anchors_per_seq": 4}})
    (tmp_path / "run").mkdir()
    return stage_context("train", recipe, tmp_path / "run", inputs={"tokenize.dataset": data}), data


def test_train_refuses_a_dataset_rendered_with_thinking_off(tmp_path):
    ctx, data = _train_ctx(tmp_path, thinking=True)
    made_with = chat_contract.recipe_contract(ctx.recipe.target.model_copy(
        update={"chat_template": ctx.recipe.target.chat_template.model_copy(update={"enable_thinking": False})}))
    chat_contract.write(data, made_with)
    with pytest.raises(StageFailed, match=r"tokenize\.dataset.*enable_thinking=False.*enable_thinking=True"):
        train_stage.run(ctx)
    assert not (ctx.out_dir / "checkpoint").exists()  # refused before the first step

