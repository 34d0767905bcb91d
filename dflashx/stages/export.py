"""The export stage: the trained drafter as servable folders, checked against each engine's contract.

Reads `train.checkpoint` (the last drafter, or the one with the best held-out τ when the train stage
measured one above the last's: `checkpoint/tau.json`, `dflashx.dflash.tau_record.HeldOutTau`; the
stage's metrics say which, `exported`); writes
- `drafter/` — the DFlash / z-lab layout: config.json (`architectures: ["DFlashDraftModel"]`,
  `block_size`, `dflash_config: {mask_token_id, target_layer_ids, ...}`, `num_target_layers`,
  `layer_types`, the Qwen3 fields) and model.safetensors (the public DFlash parameter names, in
  `stages.export.dtype`; DFlash2: `architectures: ["DFlash2DraftModel"]`, `is_causal: false`, its
  keys in `dflash_config`, the selector codebooks stored without `.weight`, all written by
  `dflash.checkpoint.save_drafter`). SGLang takes it as `--speculative-draft-model-path` with
  `--speculative-algorithm DFLASH`, the z-lab `dflash` package loads it, `drafter.init_from`
  continues training from it.
- `drafter-vllm/` — the speculators layout vLLM serves (`dflashx.export.speculators`): its
  config.json and the same weights. DFlash only: vLLM serves DFlash2 from `drafter/` itself
  (`qwen3_dflash2.py`, vLLM PR #52816), and the speculators layout has no DFlash2 form.
Both get a README.md with the SGLang and vLLM serve commands, which the stage also prints (into
export/stage.log under `dflashx run`, which captures stage output). Before
that, `check_sglang` and `check_speculators` read back what was written (config and weight shapes)
against the target's facts (`ctx.recipe.target.facts`); any broken rule stops the stage with
`StageFailed`, naming each key and its fix (docs/export.md).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from dflashx.config.architectures import architecture
from dflashx.config.fields import TORCH_DTYPE
from dflashx.export import (Serving, Violation, check_sglang, check_speculators, commands, readme, report,
                            to_speculators)
from dflashx.export.causality import trained
from dflashx.export.architecture import export_half
from dflashx.data import chat_contract
from dflashx.dflash.tau_record import HeldOutTau
from dflashx.resolve.model import ResolvedRecipe
from dflashx.stages.base import Artifact, ExportContext, StageContext, StageFailed, StageResult
from dflashx.stages.graph import input_name
from dflashx.store.atomic import atomic_dir, atomic_write_text
from dflashx.targets.registry import TargetFacts
from dflashx.targets.locate import locate_target

CHECKPOINT = input_name("export")
OUT = "drafter"  # artifact and folder: the SGLang / z-lab layout
VLLM = "drafter_vllm"  # artifact of the speculators layout ...
VLLM_DIR = "drafter-vllm"  # ... and its folder
CONFIG, WEIGHTS, README_FILE = "config.json", "model.safetensors", "README.md"


def _read(folder: Path) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """config.json and the weights' shapes (from the safetensors header, no tensor is loaded)."""
    from dflashx.dflash.checkpoint import weight_shapes

    return json.loads((folder / CONFIG).read_text()), weight_shapes(folder)


def served_target(ctx: StageContext[Any]) -> str:
    """What an engine loads the target from: the hub id or folder (a built-in's cached build)."""
    return str(locate_target(ctx.recipe.target))


def write_speculators(drafter_dir: Path, out: Path, target: str) -> None:
    """The speculators folder next to the DFlash one: converted config.json, the same weights."""
    config = json.loads((drafter_dir / CONFIG).read_text())
    spec = to_speculators(config, verifier=target)
    with atomic_dir(out) as tmp:
        (tmp / CONFIG).write_text(json.dumps(spec, indent=2) + "\n")
        shutil.copyfile(drafter_dir / WEIGHTS, tmp / WEIGHTS)


def contract_violations(facts: TargetFacts, drafter_dir: Path,
                        vllm_dir: Path | None) -> list[tuple[str, Path, list[Violation]]]:
    """Each written folder's engine, the folder and the rules of that engine it breaks (config.json and the
    weight shapes read back; no speculators folder for DFlash2). The export round-trip gate runs it too."""
    config, shapes = _read(drafter_dir)
    out = [("SGLang / z-lab", drafter_dir, check_sglang(config, facts, shapes))]
    if vllm_dir is not None:  # held to the causality the DFlash folder says the drafter was trained with
        spec, spec_shapes = _read(vllm_dir)
        out.append(("vLLM / speculators", vllm_dir, check_speculators(spec, facts, spec_shapes,
                                                                       causal=trained(config))))
    return out


def write_folders(drafter: Any, out: Path, vllm_out: Path, dtype: Any, target: str) -> Path | None:
    """The drafter in the DFlash layout at `out` and, where it has one, the speculators layout at `vllm_out` (its
    folder, or None: vLLM serves DFlash2 from the DFlash layout itself, PR #52816 qwen3_dflash2.py, and a DFlash
    drafter whose layers differ in causality has no speculators form: the architecture's export half says,
    `speculators_form`). The export round-trip
    gate writes through it too."""
    from dflashx.dflash.checkpoint import save_drafter

    save_drafter(drafter, out, dtype=dtype)
    if not export_half(drafter.config.architecture).speculators_form(json.loads((out / CONFIG).read_text())):
        return None
    write_speculators(out, vllm_out, target)
    return vllm_out


def exported(tau: HeldOutTau | None) -> dict[str, Any]:
    """Which of the train stage's drafters was exported: `best` (held-out τ), else `last`, with its step and τ."""
    if tau is None:
        return {"exported": "last"}
    point = tau.best if tau.exported == "best" else tau.last
    return {"exported": tau.exported, "exported_step": point.step, "exported_heldout_tau": point.tau}


def write_export(recipe: ResolvedRecipe, drafter: Any, out_dir: Path, target: str,
                 trained_for: chat_contract.ChatContract | None) -> Path | None:
    """The export's work on a loaded drafter: both layouts under `out_dir` (`write_folders`), the engines' contracts
    read back (`StageFailed` naming every broken key), the README with the serve commands in each folder (and the
    chat contract the drafter was trained under, when known), the commands printed. Returns the speculators
    folder, or None. `benchmarks/fixed_costs.py` times it on the tiny drafter (the plan's `export` part)."""
    import torch

    dtype = getattr(torch, TORCH_DTYPE[recipe.stages.export.dtype])
    out = out_dir / OUT
    vllm = write_folders(drafter, out, out_dir / VLLM_DIR, dtype, target)
    found = contract_violations(recipe.target.facts, out, vllm)
    failures = [f"{folder / CONFIG}: " + report(engine, broken) for engine, folder, broken in found if broken]
    if failures:
        raise StageFailed("export: the drafter does not meet the serving engines' contracts for target "
                          f"{recipe.target.model}\n" + "\n".join(failures),
                          metrics={"contract_violations": sum(len(v) for _, _, v in found)})
    config = json.loads((out / CONFIG).read_text())
    serving = Serving.of(config, recipe.target.facts, target, str(out), str(vllm or out),
                         tp=recipe.stages.generate.serving.tp)
    text = readme(serving, config, recipe.name, recipe.stages.export.dtype)
    for folder in (out, vllm) if vllm is not None else (out,):
        atomic_write_text(folder / README_FILE, text)
        if trained_for is not None:
            chat_contract.write(folder, trained_for)
    print(f"export: serve the drafter with\n{commands(serving)}", flush=True)  # stage.log under `dflashx run`
    return vllm


def run(ctx: ExportContext) -> StageResult:
    from dflashx.dflash.checkpoint import load_drafter

    if CHECKPOINT not in ctx.inputs:
        raise ValueError(f"export stage needs input `{CHECKPOINT}` (the train stage's drafter); enable stages.train")
    trained = Path(ctx.inputs[CHECKPOINT])
    tau = HeldOutTau.read(trained)  # held-out τ measured while training: the best drafter when it beat the last
    drafter = load_drafter(HeldOutTau.handed_on(trained))
    vllm = write_export(ctx.recipe, drafter, ctx.out_dir, served_target(ctx), chat_contract.read(trained))
    out = ctx.out_dir / OUT
    kind = architecture(drafter.config.architecture).hf_name
    artifacts = {OUT: Artifact(OUT, tier="irreplaceable", description=f"{kind} drafter (SGLang / z-lab / vLLM "
                               "layout): config.json + model.safetensors")}
    if vllm is not None:
        artifacts[VLLM] = Artifact(VLLM_DIR, tier="replaceable",
                                   description="the same drafter in the speculators layout (vLLM)")
    return StageResult(
        artifacts=artifacts,
        metrics={"parameters": sum(p.numel() for p in drafter.parameters()),
                 "bytes": sum(f.stat().st_size for f in out.iterdir())} | exported(tau),
    )
