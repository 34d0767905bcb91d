"""A third drafter architecture, registered inside this test and nowhere else (issue 39): DFlash plus one extra
linear layer (`toy_layer`, Linear(h -> h)), its own recipe key (`drafter.toy_scale`), its own proposal (the rows'
hidden states plus `toy_scale` x the layer's output through the LM head) and a one-folder export. This module is
its one module (pure half, torch half and export half: the spec names this module for both halves) and the
fixture's `register` is its one registration line. With no edit to any other module: the planner prices it and
counts exactly one h x h layer more than DFlash, training runs 2 steps, the export writes it and reads it back, and
the decoder decodes with it through its own proposal."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

import pytest
import torch
from pydantic import Field
from torch import nn
from typer.testing import CliRunner

from dflashx.cli.main import app
from dflashx.config import architectures
from dflashx.config.architectures import dflash
from dflashx.config.architectures.spec import ArchitectureSpec, ModuleFigures, Shapes
from dflashx.config.fields import OUTPUT, Strict
from dflashx.dflash.proposal import choose
from dflashx.dflash.selector_loss import SelectorOutput
from dflashx.export.contract import Violation
from dflashx.plan.plan import make_plan
from dflashx.targets.registry import TargetFacts
from _plan_recipes import REPO, tiny_recipe
from helpers_dflash import load_target, tiny_dataset, tiny_target, train_job

NAME = "toy"
PROPOSED: list[int] = []  # blocks the toy's own proposal drafted


# ---------------------------------------------------------------- the pure half: keys and the planner's figures

class ToyKeys(Strict):
    toy_scale: float = Field(1.0, gt=0, description="Toy: weight of the extra layer's output in the proposal.",
                             json_schema_extra=OUTPUT)


def figures(shapes: Shapes, keys: ToyKeys) -> ModuleFigures:
    """One Linear(h -> h) without bias: a weight matrix every supervised slot's gradient reaches."""
    h = shapes.hidden_size
    return ModuleFigures(NAME, matrices=h * h, slot_flops=2.0 * h * h, serving_slot_flops=2.0 * h * h)


SPEC = ArchitectureSpec(
    name=NAME, hf_name="ToyDraftModel", summary="DFlash plus one linear layer", keys=ToyKeys, figures=figures,
    published=dflash.PUBLISHED, published_block=dflash.PUBLISHED_BLOCK, torch=__name__, export=__name__,
    engines=tuple(dataclasses.replace(row, architecture=NAME) for row in dflash.ENGINES), keys_in_config=True)


# ---------------------------------------------------------------- the torch half

FILE_NAMES: dict[str, str] = {}

def layer_modules(config: Any) -> dict[str, nn.Module]:
    return {}


def drafter_modules(config: Any) -> dict[str, nn.Module]:
    return {"toy_layer": nn.Linear(config.hidden_size, config.hidden_size, bias=False)}


def around(layer: nn.Module, side: str, sublayer: Any, x: torch.Tensor) -> torch.Tensor:
    return sublayer(x)


def loss_top_k(drafter: nn.Module) -> int:
    return 1  # the supervised rows, for its loss term


def extra_loss(drafter: Any, out: Any, batch: Any, head: torch.Tensor, gold_missing: str,
               chunk: int) -> SelectorOutput | None:
    """A small L2 term on the layer's output at the supervised rows (so the layer trains)."""
    if out.supervised is None:
        return None
    zeros = torch.zeros(drafter.config.block_size, device=head.device)
    return SelectorOutput(drafter.toy_layer(out.supervised.rows).float().pow(2).mean(), zeros, zeros)


def extra_loss_weight(weight: float, ramp: float) -> float:
    return 1e-3


def _logits(drafter: Any, hidden: torch.Tensor, lm_head: Any) -> torch.Tensor:
    scale = SPEC.keys_of(drafter.config).toy_scale
    return lm_head(hidden + scale * drafter.toy_layer(hidden))


def propose(drafter: Any, ctx: Any, anchor: int, rows: int, embed: Any, lm_head: Any, sampling: Any,
            generator: torch.Generator | None) -> Any:
    PROPOSED.append(anchor)
    return choose(_logits(drafter, drafter.block_hidden(ctx, anchor, embed, rows), lm_head), sampling, generator)


def propose_rows(drafter: Any, hidden: torch.Tensor, lm_head: Any, anchors: torch.Tensor, sampling: Any,
                 generator: torch.Generator | None) -> Any:
    PROPOSED.extend(anchors.tolist())
    return choose(_logits(drafter, hidden, lm_head), sampling, generator)


# ---------------------------------------------------------------- the export half: one folder, the DFlash layout

DISPLAY = "Toy"
DESCRIBE = "DFlash plus one linear layer (a test's architecture)"
VLLM_READS_DFLASH_LAYOUT = True


def check(config: Mapping[str, Any], facts: TargetFacts, shapes: Any) -> list[Violation]:
    scale = (config.get("dflash_config") or {}).get("toy_scale")
    return [] if isinstance(scale, (int, float)) else [Violation("dflash_config.toy_scale", "missing", "write it")]


def speculators_form(config: Mapping[str, Any]) -> bool:
    return False


def one_folder_why() -> str:
    return "the toy is read in the DFlash layout"


def rows(dflash_config: Mapping[str, Any]) -> list[tuple[str, Any]]:
    return [("extra layer", f"scale {dflash_config.get('toy_scale')}")]


def notes(block_size: int) -> list[str]:
    return []


def vllm_gpu(row: Any) -> str:
    return ""


def vllm_cpu() -> str | None:
    return "no engine serves the toy"


# ---------------------------------------------------------------- the tests

@pytest.fixture(autouse=True)
def toy():
    architectures.register(SPEC)  # the one registration line
    yield SPEC
    architectures.unregister(NAME)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    return tiny_target(root / "target"), tiny_dataset(root / "data", n=8)


def test_the_plan_prices_it_and_counts_one_layer_more_than_dflash() -> None:
    toy, plain = (make_plan(tiny_recipe(drafter__architecture=a, drafter__toy_scale=2.0 if a == NAME else 1.0))
                  for a in (NAME, "dflash"))
    assert not [f for f in toy.findings if f.severity == "error"]
    assert toy.resolved is not None and plain.resolved is not None
    h = toy.resolved.drafter.hidden_size
    assert toy.resolved.drafter.dims.trainable == plain.resolved.drafter.dims.trainable + h * h
    assert toy.stage("train").estimates.seconds > 0 and toy.totals.usd >= plain.totals.usd
    result = CliRunner().invoke(app, ["plan", str(REPO / "recipes" / "tiny.yaml"), "drafter.architecture=toy",
                                      "drafter.toy_scale=2", "--json"])
    assert result.exit_code == 0, result.output
    planned = json.loads(result.output)
    assert planned["resolved"]["drafter"]["architecture"] == NAME and planned["resolved"]["drafter"]["toy_scale"] == 2
    assert {s["name"]: s for s in planned["stages"]}["train"]["estimates"]["usd"] >= 0


def test_its_key_is_checked_and_enters_the_stage_key() -> None:
    from dflashx.run.keys import key_material

    with pytest.raises(ValueError, match="toy_scale"):
        tiny_recipe(drafter__architecture=NAME, drafter__toy_scale=0)
    one, two = (make_plan(tiny_recipe(drafter__architecture=NAME, drafter__toy_scale=s)).resolved for s in (1, 2))
    assert key_material("train", one, {}) != key_material("train", two, {})


def test_it_trains_two_steps_exports_reads_back_and_decodes_through_its_proposal(paths, tmp_path) -> None:
    from dflashx.dflash.checkpoint import load_drafter, save_drafter
    from dflashx.dflash.model import DFlashDrafter
    from dflashx.dflash.spec_decode import SpecDecoder
    from dflashx.dflash.trainer import run_training
    from dflashx.export import check_sglang
    from dflashx.stages.export import write_folders

    target_dir, data = paths
    logs: dict[int, dict] = {}
    job = train_job(tmp_path / "train", data, target_dir, drafter={"architecture": NAME, "toy_scale": 2.0},
                    max_steps=2, epochs=1, global_batch=2, micro_batch=1, zero_stage=0, lr=1e-2, log_every=1)
    run_training(job, log=lambda metrics, step: logs.__setitem__(step, metrics))
    assert sorted(logs) == [1, 2] and all(m["loss"] > 0 for m in logs.values())

    model, _ = load_target(target_dir)
    drafter = load_drafter(tmp_path / "train" / "checkpoint")  # what the trainer exported
    assert isinstance(drafter, DFlashDrafter) and drafter.config.architecture == NAME
    h = drafter.config.hidden_size
    plain = sum(p.numel() for n, p in drafter.named_parameters() if not n.startswith("toy_layer"))
    assert sum(p.numel() for p in drafter.parameters()) == plain + h * h == drafter.config.dims.trainable

    folder = tmp_path / "export" / "drafter"
    assert write_folders(drafter, folder, tmp_path / "export" / "drafter-vllm", torch.float32, str(target_dir)) is None
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["ToyDraftModel"] and config["dflash_config"]["toy_scale"] == 2.0
    assert check_sglang(config, job.target.facts) == []
    back = load_drafter(folder)
    assert back.config == drafter.config
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), drafter.state_dict().values()))

    prompt = [5, 9, 14, 3, 22, 7]
    PROPOSED.clear()
    out = SpecDecoder(model, back.eval()).generate(prompt, 12)
    want = model.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12, do_sample=False,
                          eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert out.output_ids == want and PROPOSED  # greedy speculative decoding is the target's, drafted by the toy
    save_drafter(back, tmp_path / "again")  # and the read-back drafter writes again
