"""The export round-trip gate (`dflashx.run.roundtrip`, issue 31) on the tiny recipe, for real: the built-in
tiny target, the recipe's drafter overfitted on two of the target's replies, exported through the export
stage's code, loaded back with the eval stage's loader and decoded with the target.

It passes the tiny recipe, and three export faults planted in the written folder (its config.json edited
on disk, as a broken export would write it) are each named, within 60 s of gate time on the CPU:
the tapped layers off by one, the mask token changed after training, a layer's causality flipped.

The gate runs single-threaded here: on the shared 2-core test machine, torch's second thread makes the
tiny models' small matmuls about 10x slower under load (an environment setting, not the gate's).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dflashx.config.load import load_recipe
from dflashx.plan.plan import make_plan
from dflashx.run import roundtrip
from dflashx.targets.facts import facts_for

REPO = Path(__file__).resolve().parents[1]
LIMIT_S = 60.0


@pytest.fixture(scope="module")
def overfitted() -> Iterator[roundtrip.Overfitted]:
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    recipe = load_recipe(REPO / "recipes" / "tiny.yaml").recipe
    plan = make_plan(recipe, facts_for(recipe.target))
    assert plan.resolved is not None
    o = roundtrip.prepare(plan.resolved)
    yield o
    roundtrip.release(o)
    torch.set_num_threads(threads)


def _gate(o: roundtrip.Overfitted, folder: Path, plant: Callable[[dict[str, Any]], None] | None = None):
    """Export into `folder`, plant the fault into drafter/config.json, check; the result and the gate's
    time (the shared overfit's plus this export's and check's)."""
    t0 = time.perf_counter()
    shutil.rmtree(folder, ignore_errors=True)
    roundtrip.export(o, folder)
    if plant is not None:
        file = folder / "drafter" / "config.json"
        config = json.loads(file.read_text())
        plant(config)
        file.write_text(json.dumps(config, indent=2))
    result = roundtrip.check(o, folder)
    return result, o.seconds + time.perf_counter() - t0


def test_the_gate_passes_the_tiny_recipe(overfitted: roundtrip.Overfitted, tmp_path: Path) -> None:
    result, seconds = _gate(overfitted, tmp_path / "export")
    assert result.ok, result.message()
    block = overfitted.drafter.config.block_size
    assert result.threshold == pytest.approx(0.8 * block)
    assert set(result.tau) == {"drafter", "drafter-vllm"}  # both layouts the export stage writes
    assert all(tau >= result.threshold for tau in result.tau.values())
    assert overfitted.trained_tau >= result.threshold
    assert not overfitted.checks  # the tokenize stage encodes the target's replies as the engine serves them
    assert seconds < LIMIT_S, seconds
    print(f"\ngate on the tiny recipe: {seconds:.1f} s, {result.message()}")


def _layers_off_by_one(config: dict[str, Any]) -> None:
    config["dflash_config"]["target_layer_ids"] = [i + 1 for i in config["dflash_config"]["target_layer_ids"]]


def _mask_changed(config: dict[str, Any]) -> None:
    config["dflash_config"]["mask_token_id"] += 1


def _causality_flipped(config: dict[str, Any]) -> None:
    flags = config["dflash_config"]["causal_layers"]
    flags[0] = not flags[0]
    config["is_causal"] = flags[0] if len(set(flags)) == 1 else config.pop("is_causal", None)


# fault: (plant, the key named, whether τ falls under the threshold too). Measured on the tiny target: a
# changed mask token drops τ to ~1, a flipped causality to ~5 of 8; the tapped layers one off keep it (the
# overfitted drafter decodes the tiny target's neighbouring layers the same), so the comparison of every
# trained value with the one read back is what names that fault, τ cannot.
FAULTS = {
    "target_layer_ids": (_layers_off_by_one, "dflash_config.target_layer_ids", False),
    "mask_token_id": (_mask_changed, "dflash_config.mask_token_id", True),
    "causality": (_causality_flipped, "dflash_config.causal_layers", True),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_the_gate_names_each_planted_export_fault(overfitted: roundtrip.Overfitted, tmp_path: Path,
                                                  fault: str) -> None:
    plant, key, drops_tau = FAULTS[fault]
    result, seconds = _gate(overfitted, tmp_path / "export", plant)
    message = result.message()
    assert not result.ok
    failed = [c for c in result.checks if c.status == "fail"]
    assert any(c.key == f"drafter/config.json {key}" or c.key.startswith(f"drafter/config.json {key}")
               for c in failed), message
    assert key in message and "fix:" in message
    # the untouched speculators folder still decodes: the fault is pinned to the folder that has it
    assert result.tau["drafter-vllm"] >= result.threshold
    if drops_tau:  # the drafter fills its block otherwise, or attends otherwise: τ falls and is named
        assert result.tau["drafter"] < result.threshold
        assert any(c.code == "tau" and c.key == "drafter/" for c in failed), message
        assert "not from the export" in message  # in memory it decodes: the export is the cause
    assert seconds < LIMIT_S, seconds
    print(f"\ngate on fault {fault}: {seconds:.1f} s\n{message}")


def test_the_gate_exports_afresh_and_deletes_its_exports_once_passed(overfitted: roundtrip.Overfitted,
                                                                      tmp_path: Path) -> None:
    folder = tmp_path / "roundtrip"
    stale = folder / "drafter-vllm" / "stale.safetensors"  # an earlier pilot's export, another architecture's
    stale.parent.mkdir(parents=True)
    stale.write_text("old weights")
    roundtrip.export(overfitted, folder)
    assert not stale.exists() and (folder / "drafter" / "config.json").is_file()
    result = roundtrip.gate(overfitted, folder)
    assert result.ok, result.message()
    assert not folder.exists()  # passed: the exports (gigabytes on a real drafter) are deleted
