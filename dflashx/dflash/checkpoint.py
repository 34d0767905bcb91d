"""Drafter checkpoints in the public DFlash layout, and atomic DeepSpeed training checkpoints.

Exported layout (what the z-lab `dflash` package and SGLang load): a folder with `config.json`
(`DFlashConfig.to_hf_dict()`) and `model.safetensors` whose keys are the drafter's own parameter
names (`layers.N.self_attn.q_proj.weight`, ..., `norm.weight`, `fc.weight`, `hidden_norm.weight`);
the target's embedding and LM head are not in it. DFlash2 adds `layers.N.attention_conv.*`,
`layers.N.mlp_conv.*` and `candidate_selector.*`, whose two codebooks are stored as the published
checkpoints store them, without `.weight` (`candidate_selector.predecessor_codebook`,
`candidate_selector.successor_codebook`; the reference maps them back with `key_mapping`, and so
does `load_weights_into`): each architecture's torch half names such parameters (`FILE_NAMES`).

Training checkpoints: `engine.save_checkpoint` writes into a temporary tag, which is put in place
as `step-XXXXXXXX` once every rank is done; then `latest` is replaced atomically (both through
`dflashx.store.atomic`). A kill at any moment leaves the previous checkpoint and pointer intact,
and so does a full disk (`DiskFull`, the partial state removed). Only then are old states pruned
(`stages.train.keep_checkpoints`: the K newest and the best by logged loss stay).

The drafter with the best held-out τ so far (`dflashx.dflash.tau_probe`) is kept beside the training
states as `best-tau/` (the DFlash layout plus its `tau.json` measurement, written as one folder), so a
killed run resumes with it.

Public API: `save_drafter(drafter, out_dir, dtype=None, extra=None)`, `save_best_tau(drafter, stage_dir,
point, dtype)`, `best_tau(stage_dir)`, `load_drafter(path, device, dtype)`,
`weight_shapes(path)`,
`load_weights_into(drafter, path)` (continue from a public checkpoint), `save_training_state(
engine, ckpt_dir, step, client_state, rank_state, loss=None, keep=None)`, `latest_tag(ckpt_dir)`,
`best_tag(ckpt_dir)`, `prune_checkpoints(ckpt_dir, keep)`,
`load_training_state(engine, ckpt_dir, rank) -> (client_state, rank_state) | None`,
`adam_steps_as_tensors(engine)`.
"""

from __future__ import annotations

import json
import math
import shutil
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from dflashx.dflash.architecture import torch_half
from dflashx.dflash.config import DFlashConfig
from dflashx.dflash.model import DFlashDrafter
from dflashx.dflash.tau_record import TAU_FILE
from dflashx.resolve.tau import TauPoint
from dflashx.store.atomic import atomic_dir, atomic_write_text, replace_dir, settled_dir
from dflashx.store.diskspace import stop_when_full, used_bytes

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
LATEST = "latest"
STEP_GLOB = "step-*"
BEST_TAU = "best-tau"  # in the train stage folder: the drafter with the best held-out τ so far, and its TauPoint
META_FILE = "dflashx_state.json"  # in each training state: {"step", "loss"} (the logged window loss)


def save_drafter(drafter: DFlashDrafter, out_dir: str | Path, dtype: torch.dtype | None = None,
                 extra: dict[str, str] | None = None) -> Path:
    """Write config.json + model.safetensors (and the `extra` {file name: text}) into `out_dir`, replaced
    atomically as a folder."""
    out_dir = Path(out_dir)
    hf = drafter.config.to_hf_dict()
    if dtype is not None:
        hf["torch_dtype"] = str(dtype).removeprefix("torch.")
    names = torch_half(drafter.config.architecture).FILE_NAMES  # parameters stored under another name
    state = {names.get(k, k): v.detach().to(dtype or v.dtype).contiguous().cpu()
             for k, v in drafter.state_dict().items()}
    needed = sum(v.numel() * v.element_size() for v in state.values())
    with (stop_when_full(out_dir.parent, f"the drafter {out_dir.name}/", needed, "its weights"),
          atomic_dir(out_dir) as tmp):
        (tmp / CONFIG_FILE).write_text(json.dumps(hf, indent=2) + "\n")
        save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        for name, text in (extra or {}).items():
            (tmp / name).write_text(text)
    return out_dir


def save_best_tau(drafter: DFlashDrafter, stage_dir: str | Path, point: TauPoint, dtype: torch.dtype) -> Path:
    """The drafter with the best held-out τ so far, and its measurement, as one folder (`BEST_TAU`)."""
    return save_drafter(drafter, Path(stage_dir) / BEST_TAU, dtype, extra={TAU_FILE: point.model_dump_json()})


def copy_drafter(src: str | Path, out_dir: str | Path) -> Path:
    """The drafter folder `src` (config.json + model.safetensors) copied to `out_dir`, replaced atomically."""
    src, out_dir = Path(src), Path(out_dir)
    needed = sum((src / name).stat().st_size for name in (CONFIG_FILE, WEIGHTS_FILE))
    with (stop_when_full(out_dir.parent, f"the drafter {out_dir.name}/", needed, "its files"),
          atomic_dir(out_dir) as tmp):
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            shutil.copyfile(src / name, tmp / name)
    return out_dir


def best_tau(stage_dir: str | Path) -> TauPoint | None:
    """The measurement of the best-τ drafter kept in the stage folder (None: none yet; a folder a kill left
    aside mid-replacement is put back first)."""
    file = settled_dir(Path(stage_dir) / BEST_TAU) / TAU_FILE
    return TauPoint.model_validate_json(file.read_text()) if file.is_file() else None


def _read_config(path: Path) -> DFlashConfig:
    file = path / CONFIG_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no config.json; a DFlash checkpoint folder holds config.json + "
                                "model.safetensors")
    try:
        return DFlashConfig.from_hf_dict(json.loads(file.read_text()))
    except (KeyError, ValueError) as exc:
        raise ValueError(f"{file}: not a DFlash drafter config ({exc})") from exc


def load_weights_into(drafter: DFlashDrafter, path: str | Path) -> None:
    """Copy a checkpoint folder's weights into `drafter`; names (as stored: the architecture's `FILE_NAMES`) and
    shapes must match exactly."""
    file = Path(path) / WEIGHTS_FILE
    own_names = {stored: name for name, stored in torch_half(drafter.config.architecture).FILE_NAMES.items()}
    state = {own_names.get(k, k): v for k, v in load_file(str(file)).items()}
    own = drafter.state_dict()
    missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    bad = [k for k in own.keys() & state.keys() if own[k].shape != state[k].shape]
    if missing or extra or bad:
        raise ValueError(
            f"{file}: weights do not fit this drafter (missing {missing[:4]}, unexpected {extra[:4]}, "
            f"shape mismatch {bad[:4]}); check drafter.num_layers/num_target_layers against its config.json"
        )
    drafter.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})


def weight_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Name (as stored) -> shape of a checkpoint folder's weights, from the safetensors header (nothing
    loaded)."""
    from safetensors import safe_open

    with safe_open(str(Path(path) / WEIGHTS_FILE), "pt") as f:
        return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118 - not iterable


def load_drafter(path: str | Path, device: str | torch.device = "cpu",
                 dtype: torch.dtype | None = None) -> DFlashDrafter:
    """Build a drafter from a DFlash or DFlash2 checkpoint folder (ours or a public one)."""
    path = Path(path)
    drafter = DFlashDrafter(_read_config(path))
    load_weights_into(drafter, path)
    return drafter.to(device=device, dtype=dtype) if dtype else drafter.to(device)


def _pointer(ckpt_dir: Path) -> str | None:
    pointer = ckpt_dir / LATEST
    return pointer.read_text().strip() if pointer.is_file() else None


def latest_tag(ckpt_dir: str | Path) -> str | None:
    """The tag the `latest` pointer names, if it exists and its folder is complete."""
    tag = _pointer(Path(ckpt_dir))
    return tag if tag and (Path(ckpt_dir) / tag).is_dir() else None


def _step_tags(ckpt_dir: Path) -> list[str]:
    """The complete training states (`step-N` folders), oldest first."""
    return sorted((p.name for p in ckpt_dir.glob(STEP_GLOB) if p.is_dir()), key=lambda t: int(t.removeprefix("step-")))


def checkpoint_loss(folder: str | Path) -> float | None:
    """The window loss the trainer logged last at or before this state's step (None: none yet)."""
    meta = Path(folder) / META_FILE
    loss = json.loads(meta.read_text()).get("loss") if meta.is_file() else None
    return float(loss) if loss is not None and math.isfinite(loss) else None


def best_tag(ckpt_dir: str | Path) -> str | None:
    """The state with the lowest logged loss (the newest of equal ones); None when none has one."""
    scored = [(loss, -i, tag) for i, tag in enumerate(_step_tags(Path(ckpt_dir)))
              if (loss := checkpoint_loss(Path(ckpt_dir) / tag)) is not None]
    return min(scored)[2] if scored else None


def prune_checkpoints(ckpt_dir: str | Path, keep: int | None) -> list[str]:
    """Delete the training states other than the `keep` newest, the best (`best_tag`) and the one
    `latest` names; `keep=None` keeps them all. Returns the tags deleted."""
    ckpt_dir = Path(ckpt_dir)
    if keep is None:
        return []
    tags = _step_tags(ckpt_dir)
    stay = {*tags[-keep:], _pointer(ckpt_dir), best_tag(ckpt_dir)}
    gone = [tag for tag in tags if tag not in stay]
    for tag in gone:
        shutil.rmtree(ckpt_dir / tag, ignore_errors=True)
    return gone


def _discard(ckpt_dir: Path, tmp: Path, tag: str) -> None:
    """After a failed save: drop its partial folder, and its renamed one unless `latest` names it."""
    shutil.rmtree(tmp, ignore_errors=True)
    if _pointer(ckpt_dir) != tag:
        shutil.rmtree(ckpt_dir / tag, ignore_errors=True)


def save_training_state(
    engine: Any, ckpt_dir: str | Path, step: int, client_state: dict[str, Any], rank_state: dict[str, Any],
    loss: float | None = None, keep: int | None = None,
) -> str:
    """Collective: every rank writes its shard into a tmp tag; rank 0 renames it, moves `latest`,
    then prunes to `keep` (`prune_checkpoints`). `loss` is the last logged window loss, kept in the
    state's META_FILE to pick the best. A full disk raises `DiskFull` on the rank that hit it, after
    removing the partial state; the previous state and `latest` stay as they were."""
    import torch.distributed as dist

    ckpt_dir = Path(ckpt_dir)
    tag, tmp_tag = f"step-{step:08d}", f"tmp-step-{step:08d}"
    tmp = ckpt_dir / tmp_tag
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        for stale in ckpt_dir.glob(f"tmp-{STEP_GLOB}"):  # left by a kill or a full disk
            shutil.rmtree(stale, ignore_errors=True)
    if dist.is_initialized():
        dist.barrier()
    last = latest_tag(ckpt_dir)
    guard = partial(stop_when_full, ckpt_dir, what=f"training checkpoint {tag}",
                    cleanup=lambda: _discard(ckpt_dir, tmp, tag),
                    needed=lambda: used_bytes(ckpt_dir / last) if last else used_bytes(tmp),
                    basis="the size of the last complete checkpoint" if last else "written before the disk filled")
    with guard():
        engine.save_checkpoint(str(ckpt_dir), tag=tmp_tag, client_state=client_state, save_latest=False)
        torch.save(rank_state, tmp / f"rank_state_{rank}.pt")
        if rank == 0:
            atomic_write_text(tmp / META_FILE, json.dumps({"step": step, "loss": loss}) + "\n")
    if dist.is_initialized():
        dist.barrier()
    if rank == 0:
        with guard():
            replace_dir(tmp, ckpt_dir / tag)
            atomic_write_text(ckpt_dir / LATEST, tag)
        prune_checkpoints(ckpt_dir, keep)
    if dist.is_initialized():
        dist.barrier()
    return tag


def load_training_state(engine: Any, ckpt_dir: str | Path, rank: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Restore engine (weights, optimizer, scheduler) from `latest`; None when there is none."""
    tag = latest_tag(ckpt_dir)
    if tag is None:
        return None
    _, client_state = engine.load_checkpoint(str(ckpt_dir), tag=tag)
    adam_steps_as_tensors(engine)
    rank_file = Path(ckpt_dir) / tag / f"rank_state_{rank}.pt"
    rank_state = torch.load(rank_file, weights_only=False) if rank_file.exists() else {}
    return client_state or {}, rank_state


def adam_steps_as_tensors(engine: Any) -> None:
    """Each parameter's Adam step as the tensor torch's AdamW keeps: a training state that DeepSpeed's compiled
    `fused_adam` wrote (Muon's AdamW half on GPUs before issue 38; `deepspeed/ops/adam/fused_adam.py` keeps
    `state["step"]` a Python int) resumes under torch's AdamW, which trains that half now. torch converts a
    loaded int the same way (`torch.optim.Adam.__setstate__`), but Muon's optimizer shares its state with the
    AdamW half without going through it."""
    basic = getattr(engine, "basic_optimizer", None)
    adam = getattr(basic, "aux_optimizer", None) or basic
    if not isinstance(adam, torch.optim.Adam | torch.optim.AdamW):
        return
    for group in adam.param_groups:
        on_device = bool(group.get("fused") or group.get("capturable"))
        for p in group["params"]:
            state = adam.state.get(p)
            if state and "step" in state and not torch.is_tensor(state["step"]):
                state["step"] = torch.tensor(float(state["step"]), dtype=torch.float32,
                                             device=p.device if on_device else "cpu")
