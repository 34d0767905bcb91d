"""The drafters the eval stage decodes with: the trained one, then each of `stages.eval.baselines`.

- `trained`: the train stage's checkpoint (`train.checkpoint`, the DFlash layout).
- `untrained`: a drafter of the trained one's config with a seeded init (`UNTRAINED_SEED`): what
  training started from, so the gap to it shows that training worked.
- a baseline folder, in either layout the export stage writes (docs/export.md), told apart by its
  config.json: `speculators_model_type` -> the speculators layout vLLM serves (its config is read
  back with `dflashx.export.from_speculators`; the weights carry the same names), `dflash_config`
  -> the z-lab / SGLang layout (ours, and z-lab's published drafters). A `path` that is not a local
  folder but a hub id (`org/name`) is downloaded first (`huggingface_hub.snapshot_download`,
  config.json and the safetensors only).

A baseline must fit the recipe's target: its config is checked against the target's facts with
its layout's engine contract (`dflashx.export.check_sglang` / `check_speculators`: tapped layers
inside the target, mask token inside its vocabulary, hidden size, layer stack, weight shapes) and
then, like the trained drafter, on the shapes the decoder shares with the target (hidden size,
vocabulary, decoder layers), before anything is decoded. A misfit stops the stage naming the
recipe item, the config key and the fix. A DFlash2 drafter (`DFlash2DraftModel`: convolutions and a
candidate selector, ours or a published one) is read in the DFlash layout and decoded with its selector.

Public API: `EvalDrafter` (name, kind, config, path, layout; `describe()` for eval.json),
`eval_drafters(ctx) -> list[EvalDrafter]` (configs read and checked, no weights loaded) and
`load(drafter, device)`, so the stage holds one drafter in memory at a time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from dflashx.config.eval_suites import TRAINED, UNTRAINED
from dflashx.dflash.tau_record import HeldOutTau
from dflashx.export import Violation, check_sglang, check_speculators, from_speculators, report
from dflashx.stages.base import EvalContext
from dflashx.stages.graph import GRAPH
from dflashx.targets.registry import TargetFacts
from dflashx.dflash.config import DFlashConfig

CHECKPOINT = GRAPH["eval"].inputs[0]
UNTRAINED_SEED = 0
DFLASH, SPECULATORS = "dflash", "speculators"  # the two folder layouts
_ENGINE: dict[str, tuple[str, Callable[..., list[Violation]]]] = {
    DFLASH: ("SGLang / z-lab", check_sglang), SPECULATORS: ("vLLM / speculators", check_speculators)}
_HUB_FILES = ["config.json", "*.safetensors"]


@dataclass(frozen=True)
class EvalDrafter:
    name: str
    kind: str  # trained | untrained | baseline
    key: str  # the recipe key or input it comes from, for errors
    config: Any  # its DFlashConfig
    path: Path | None = None
    layout: str | None = None  # DFLASH | SPECULATORS for folders

    def describe(self) -> dict[str, Any]:
        """Its eval.json entry under `drafters`."""
        return {"kind": self.kind, "path": None if self.path is None else str(self.path), "layout": self.layout,
                "block_size": self.config.block_size, "target_layer_ids": list(self.config.target_layer_ids)}


def _local(value: str, key: str) -> Path:
    """A baseline's folder: the local folder, or a hub id's download."""
    path = Path(value).expanduser()
    if path.is_dir():
        return path
    if path.exists() or value.startswith((".", "/", "~")) or value.count("/") != 1:
        raise ValueError(f"{key}.path: {value!r} is neither a drafter folder nor a hub id like "
                         "'z-lab/Qwen3.6-27B-DFlash'; fix the path")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id=value, allow_patterns=_HUB_FILES))
    except Exception as exc:  # noqa: BLE001 - offline, gated, missing: all mean "cannot fetch"
        raise ValueError(f"{key}.path: cannot download {value!r} from the hub ({exc}); download it elsewhere "
                         "and set the path to the local folder") from None


def layout_of(config: dict[str, Any], where: str, key: str) -> str:
    """The folder layout a config.json is written in (DFLASH, DFlash2's too, or SPECULATORS)."""
    if "speculators_model_type" in config:
        return SPECULATORS
    if isinstance(config.get("dflash_config"), dict):
        return DFLASH
    raise ValueError(f"{where}: neither a z-lab / SGLang DFlash config (`dflash_config`) nor a speculators one "
                     f"(`speculators_model_type`); point {key}.path at a drafter folder as `dflashx run` exports it")


def _folder(name: str, kind: str, key: str, folder: Path, facts: TargetFacts, checked: bool) -> EvalDrafter:
    """A drafter folder read (config only): its layout, its engine contract when `checked`, its config."""
    from dflashx.dflash.checkpoint import weight_shapes

    file = folder / "config.json"
    if not file.is_file():
        raise ValueError(f"{key}: {folder} has no config.json; point it at a drafter folder (config.json + "
                         "model.safetensors)")
    raw = json.loads(file.read_text())
    layout = layout_of(raw, str(file), key)
    engine, check = _ENGINE[layout]
    violations = check(raw, facts, weight_shapes(folder)) if checked else []
    if violations:
        raise ValueError(f"{key}: {file} does not fit target {facts.name}: " + report(engine, violations))
    hf = from_speculators(raw, facts.num_layers) if layout == SPECULATORS else raw
    try:
        config = DFlashConfig.from_hf_dict(hf)
    except (KeyError, ValueError) as exc:
        raise ValueError(f"{key}: {file} is not a DFlash drafter config ({exc})") from None
    return EvalDrafter(name, kind, key, config, folder, layout)


def check_fits(drafter: EvalDrafter, facts: TargetFacts) -> None:
    """The shapes a drafter shares with the target it decodes with (hidden, vocab, decoder layers)."""
    c = drafter.config
    have, want = (c.hidden_size, c.vocab_size, c.num_target_layers), (facts.hidden_size, facts.vocab_size,
                                                                        facts.num_layers)
    if have != want:
        raise ValueError(
            f"{drafter.key} ({drafter.path}): drafter (hidden, vocab, target layers) {have} does not fit target "
            f"{facts.name} {want}; evaluate it against the target it was trained for"
        )


def eval_drafters(ctx: EvalContext) -> list[EvalDrafter]:
    """The trained drafter, then the recipe's baselines in order: folders found, configs read and
    checked against the target (no weights loaded), so a misfit stops the stage before decoding."""
    if CHECKPOINT not in ctx.inputs:
        raise ValueError(f"eval stage needs input `{CHECKPOINT}` (the train stage's drafter); enable stages.train")
    facts = ctx.recipe.target.facts
    handed_on = HeldOutTau.handed_on(Path(ctx.inputs[CHECKPOINT]))  # the drafter the export stage exports
    trained = _folder(TRAINED, TRAINED, CHECKPOINT, handed_on, facts, checked=False)
    out = [trained]
    for baseline in ctx.config.baselines:
        key = f"stages.eval.baselines[{baseline.name}]"
        if baseline.path is None:
            out.append(EvalDrafter(baseline.name, UNTRAINED, key, trained.config))
        else:
            out.append(_folder(baseline.name, "baseline", key, _local(baseline.path, key), facts, True))
    for drafter in out:
        check_fits(drafter, facts)
    return out


def load(drafter: EvalDrafter, device: Any) -> Any:
    """The `DFlashDrafter` of `drafter`, in eval mode on `device`."""
    import torch

    from dflashx.dflash.checkpoint import load_weights_into
    from dflashx.dflash.model import DFlashDrafter

    if drafter.kind == UNTRAINED:
        torch.manual_seed(UNTRAINED_SEED)
    model = DFlashDrafter(drafter.config)
    if drafter.path is not None:
        load_weights_into(model, drafter.path)
    return model.to(device).eval()


read_folder = _folder  # public name for the export round-trip gate (dflashx.run.roundtrip): the same loader
