"""Drafter checkpoints in the public DFlash layout, and atomic DeepSpeed training checkpoints.

Exported layout (what the z-lab `dflash` package and SGLang load): a folder with `config.json`
(`DFlashConfig.to_hf_dict()`) and `model.safetensors` whose keys are the drafter's own parameter
names (`layers.N.self_attn.q_proj.weight`, ..., `norm.weight`, `fc.weight`, `hidden_norm.weight`);
the target's embedding and LM head are not in it.

Training checkpoints: `engine.save_checkpoint` writes into a temporary tag, which is put in place
as `step-XXXXXXXX` once every rank is done; then `latest` is replaced atomically (both through
`dflashx.store.atomic`). A kill at any moment leaves the previous checkpoint and pointer intact.

Public API: `save_drafter(drafter, out_dir, dtype=None)`, `load_drafter(path, device, dtype)`,
`load_weights_into(drafter, path)` (continue from a public checkpoint), `save_training_state(
engine, ckpt_dir, step, client_state, rank_state)`, `latest_tag(ckpt_dir)`,
`load_training_state(engine, ckpt_dir, rank) -> (client_state, rank_state) | None`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from dflashx.dflash.config import DFlashConfig
from dflashx.dflash.model import DFlashDrafter
from dflashx.store.atomic import atomic_dir, atomic_write_text, replace_dir

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
LATEST = "latest"
KEEP_CHECKPOINTS = 2


def save_drafter(drafter: DFlashDrafter, out_dir: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write config.json + model.safetensors into `out_dir` (replaced atomically as a folder)."""
    out_dir = Path(out_dir)
    hf = drafter.config.to_hf_dict()
    if dtype is not None:
        hf["torch_dtype"] = str(dtype).removeprefix("torch.")
    state = {k: v.detach().to(dtype or v.dtype).contiguous().cpu() for k, v in drafter.state_dict().items()}
    with atomic_dir(out_dir) as tmp:
        (tmp / CONFIG_FILE).write_text(json.dumps(hf, indent=2) + "\n")
        save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
    return out_dir


def _read_config(path: Path) -> DFlashConfig:
    file = path / CONFIG_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no config.json; a DFlash checkpoint folder holds config.json + model.safetensors")
    try:
        return DFlashConfig.from_hf_dict(json.loads(file.read_text()))
    except (KeyError, ValueError) as exc:
        raise ValueError(f"{file}: not a DFlash drafter config ({exc})") from exc


def load_weights_into(drafter: DFlashDrafter, path: str | Path) -> None:
    """Copy a checkpoint folder's weights into `drafter`; names and shapes must match exactly."""
    file = Path(path) / WEIGHTS_FILE
    state = load_file(str(file))
    own = drafter.state_dict()
    missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    bad = [k for k in own.keys() & state.keys() if own[k].shape != state[k].shape]
    if missing or extra or bad:
        raise ValueError(
            f"{file}: weights do not fit this drafter (missing {missing[:4]}, unexpected {extra[:4]}, "
            f"shape mismatch {bad[:4]}); check drafter.num_layers/num_target_layers against its config.json"
        )
    drafter.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})


def load_drafter(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> DFlashDrafter:
    """Build a drafter from a DFlash checkpoint folder (ours or a public one)."""
    path = Path(path)
    drafter = DFlashDrafter(_read_config(path))
    load_weights_into(drafter, path)
    return drafter.to(device=device, dtype=dtype) if dtype else drafter.to(device)


def latest_tag(ckpt_dir: str | Path) -> str | None:
    """The tag the `latest` pointer names, if it exists and its folder is complete."""
    pointer = Path(ckpt_dir) / LATEST
    if not pointer.is_file():
        return None
    tag = pointer.read_text().strip()
    return tag if (Path(ckpt_dir) / tag).is_dir() else None


def save_training_state(
    engine: Any, ckpt_dir: str | Path, step: int, client_state: dict[str, Any], rank_state: dict[str, Any]
) -> str:
    """Collective: every rank writes its shard into a tmp tag; rank 0 renames and moves `latest`."""
    import torch.distributed as dist

    ckpt_dir = Path(ckpt_dir)
    tag, tmp_tag = f"step-{step:08d}", f"tmp-step-{step:08d}"
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        shutil.rmtree(ckpt_dir / tmp_tag, ignore_errors=True)
    if dist.is_initialized():
        dist.barrier()
    engine.save_checkpoint(str(ckpt_dir), tag=tmp_tag, client_state=client_state, save_latest=False)
    torch.save(rank_state, ckpt_dir / tmp_tag / f"rank_state_{rank}.pt")
    if dist.is_initialized():
        dist.barrier()
    if rank == 0:
        replace_dir(ckpt_dir / tmp_tag, ckpt_dir / tag)
        atomic_write_text(ckpt_dir / LATEST, tag)
        old = sorted(p for p in ckpt_dir.glob("step-*") if p.is_dir())[:-KEEP_CHECKPOINTS]
        for p in old:
            shutil.rmtree(p, ignore_errors=True)
    if dist.is_initialized():
        dist.barrier()
    return tag


def load_training_state(engine: Any, ckpt_dir: str | Path, rank: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Restore engine (weights, optimizer, scheduler) from `latest`; None when there is none."""
    tag = latest_tag(ckpt_dir)
    if tag is None:
        return None
    _, client_state = engine.load_checkpoint(str(ckpt_dir), tag=tag)
    rank_file = Path(ckpt_dir) / tag / f"rank_state_{rank}.pt"
    rank_state = torch.load(rank_file, weights_only=False) if rank_file.exists() else {}
    return client_state or {}, rank_state
