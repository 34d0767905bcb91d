"""Builders for the drafter/training tests: a tiny random Qwen3 target (4 layers, hidden 64), a
local tokenizer with `<|mask|>`, a drafter config and a tokenized Arrow dataset whose sequences
follow a learnable rule (windows of one fixed token cycle), so a few training steps measurably
lower the loss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dflashx.dflash.config import DFlashConfig
from dflashx.dflash.trainer import TrainJob
from dflashx.resolve import ResolvedRecipe
from dflashx.tiny.tokenizer import MASK_TOKEN, train_tokenizer

TEXTS = [f"step {i}: add {i} and {i + 3} to get {2 * i + 3}. Then sort {i} {i + 7} {i % 5}." for i in range(60)]
torch.set_num_threads(1)


def tiny_target(out_dir: str | Path, layers: int = 4, seed: int = 0) -> Path:
    """Random Qwen3ForCausalLM + tokenizer saved in `out_dir` (the layout a resolved target has)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out_dir = Path(out_dir)
    tok = train_tokenizer(TEXTS, vocab_size=320, out_dir=out_dir)
    config = Qwen3Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    Qwen3ForCausalLM(config).save_pretrained(out_dir)
    return out_dir


def load_target(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


DRAFTER = {"num_layers": 1, "block_size": 4, "target_layer_ids": [1, 2]}


def job_recipe(target_dir: str | Path, drafter: dict[str, Any] | None = None, precision: str = "fp32",
                hardware: dict[str, Any] | None = None, **train: Any) -> ResolvedRecipe:
    """A resolved CPU-profile recipe for a local test target (its config.json and tokenizer are read
    as `dflashx plan` reads them), with `train` as stages.train."""
    from helpers_models import make_recipe, resolved

    return resolved(make_recipe(target={"model": str(target_dir), "precision": precision},
                                drafter=DRAFTER | (drafter or {}),
                                hardware=hardware or {"name": "cpu", "cpu_tflops": 0.1},
                                stages={"train": train}))


def train_job(stage_dir: str | Path, dataset: str | Path, target_dir: str | Path, **kw: Any) -> TrainJob:
    """The TrainJob the train stage would build for `job_recipe(target_dir, **kw)`."""
    return TrainJob.of(job_recipe(target_dir, **kw), stage_dir, dataset, target_dir, target_dir)


def config_for(target_config: Any, mask_token: str | None = None, **drafter: Any) -> DFlashConfig:
    """resolve -> ResolvedDrafter -> DFlashConfig for an in-memory target config (dict or HF config),
    as the trainer builds it; `drafter` are recipe drafter keys."""
    from dflashx.resolve import resolve
    from dflashx.targets.read_config import facts_from_config
    from helpers_models import make_recipe

    cfg = target_config if isinstance(target_config, dict) else target_config.to_dict()
    recipe = make_recipe(drafter={"mask_token_id": 3} | drafter)
    return DFlashConfig.from_target(resolve(recipe, facts_from_config(cfg, name="test-target")).drafter,
                                    target_config, mask_token)


def drafter_config(target, tok, **drafter: Any) -> DFlashConfig:
    return DFlashConfig.from_target(job_recipe(target.name_or_path, drafter).drafter, target.config, MASK_TOKEN)


def pattern_rows(n: int, length: int = 40, alphabet: int = 24, prompt: int = 6, seed: int = 0) -> list[dict[str, Any]]:
    """Rows {input_ids, loss_mask, length}: windows of one fixed cycle of `alphabet` token ids
    (so each token determines the next ones), loss after the first `prompt` tokens."""
    g = torch.Generator().manual_seed(seed)
    cycle = (torch.randperm(200, generator=torch.Generator().manual_seed(1234))[:alphabet] + 20).tolist()
    rows = []
    for _ in range(n):
        start = int(torch.randint(0, alphabet, (1,), generator=g))
        ids = [cycle[(start + i) % alphabet] for i in range(length)]
        rows.append({"input_ids": ids, "loss_mask": [0] * prompt + [1] * (length - prompt), "length": length})
    return rows


def tiny_dataset(out_dir: str | Path, n: int = 16, **kw: Any) -> Path:
    """A datasets Arrow folder (save_to_disk) with the tokenize stage's columns."""
    from datasets import Dataset

    Dataset.from_list(pattern_rows(n, **kw)).save_to_disk(str(out_dir))
    return Path(out_dir)


def target_and_data(root: Path, n: int = 16) -> tuple[Path, Path]:
    """A tiny target and a tiny dataset for it under `root` (the training tests' module fixture)."""
    return tiny_target(root / "target"), tiny_dataset(root / "data", n=n)


def repeating_drafter(target, tok, token: int, **drafter: Any):
    """A DFlashDrafter (fp32) that drafts `token` at every position, set by hand: its layers add
    nothing (o_proj and down_proj zero), so a masked position leaves it as the mask token's
    embedding, and the final norm's weight turns that into the LM-head row of `token`. On a random
    target whose greedy output settles into repeating `token`, it is accepted there and rejected
    elsewhere: a drafter with tau clearly above 1 without any training."""
    from dflashx.dflash.model import DFlashDrafter

    torch.manual_seed(1)
    model = DFlashDrafter(drafter_config(target, tok, **drafter))
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        mask = target.get_input_embeddings().weight[model.config.mask_token_id].float()
        unit = mask * torch.rsqrt(mask.pow(2).mean() + model.norm.variance_epsilon)
        model.norm.weight.copy_(target.get_output_embeddings().weight[token].float() / unit)
    return model


class Killed(Exception):
    """Stands in for the process dying right after a step (no checkpoint taken at that step)."""


def logged_training(stage_dir: str | Path, dataset: str | Path, target_dir: str | Path, kill_at: int | None = None,
                    **train: Any) -> dict[int, dict]:
    """`run_training` of `train_job(stage_dir, dataset, target_dir, **train)`: the metrics logged at each
    step; `Killed` raised from the logger at step `kill_at` (the run dies there, as a kill would)."""
    from dflashx.dflash.trainer import run_training

    logs: dict[int, dict] = {}

    def log(metrics: dict, step: int) -> None:
        if step == kill_at:
            raise Killed
        logs[step] = metrics

    run_training(train_job(stage_dir, dataset, target_dir, **train), log=log)
    return logs
