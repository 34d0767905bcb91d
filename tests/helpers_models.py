"""Builders for tests: a tiny random Qwen3 target with a local BPE tokenizer, recipes and contexts.

The model is random (seeded): it exercises the real transformers generate path, not quality.
`tiny_target(dir)` saves model + tokenizer in one folder, the layout a resolved target has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dflashx.config.schema import Recipe
from dflashx.plan.plan import StagePlan
from dflashx.plan.plan import make_plan
from dflashx.resolve import ResolvedRecipe, resolve
from dflashx.stages.base import StageContext
from dflashx.targets.facts import facts_for
from dflashx.targets.registry import TargetFacts, lookup
from dflashx.tiny.tokenizer import train_tokenizer

CORPUS = [
    "You are a helpful assistant. Think step by step, then answer.",
    "What is 12 plus 30? Let me add the ones and then the tens. The answer is 42.",
    "Reverse the words: apple banana cherry. The reversed list is cherry banana apple.",
    "Count the letter r in carrot. There are two letters r in carrot.",
    "Convert 3 meters to centimeters. 3 times 100 is 300 centimeters.",
    "Sort the numbers 5 3 9 1. The sorted list is 1 3 5 9.",
] * 20


def tiny_tokenizer(out_dir: str | Path, vocab_size: int = 400):
    """A byte-level BPE with the Qwen-style chat template, saved to `out_dir`."""
    return train_tokenizer(CORPUS, vocab_size=vocab_size, out_dir=out_dir)


def tiny_target(out_dir: str | Path, seed: int = 0) -> Path:
    """A 2-layer, hidden-64 random Qwen3 causal LM and its tokenizer, saved together in `out_dir`."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out_dir = Path(out_dir)
    tok = tiny_tokenizer(out_dir)
    config = Qwen3Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    Qwen3ForCausalLM(config).save_pretrained(out_dir)
    return out_dir


def make_recipe(sources: list[dict[str, Any]] | None = None, **sections: Any) -> Recipe:
    """A valid recipe on the CPU profile; `sections` replace top-level keys (e.g. stages=...)."""
    data: dict[str, Any] = {
        "name": "test",
        "dataset": {"sources": sources or [{"name": "s", "path": "unused.jsonl"}]},
        "target": {"model": "unused", "precision": "fp32"},
        "hardware": {"name": "cpu", "cpu_tflops": 0.1},
    }
    data.update(sections)
    return Recipe.model_validate(data)


def _facts(recipe: Recipe) -> TargetFacts:
    """The target's own facts (a local folder's config.json, the registry); for a target a test never loads
    (`unused`), the tiny target's."""
    facts = facts_for(recipe.target) or lookup("builtin:tiny-qwen3")
    assert facts is not None
    return facts


def resolved(recipe: Recipe) -> ResolvedRecipe:
    """`resolve` with the target's facts (`_facts`)."""
    if isinstance(recipe, ResolvedRecipe):
        return recipe
    return resolve(recipe, _facts(recipe))


def planned_runtime(recipe: Recipe, name: str) -> StagePlan:
    """What the planner hands stage `name` of `recipe` (its `StagePlan`), as `dflashx run` does."""
    return make_plan(recipe, _facts(recipe)).stage(name)


def stage_context(
    name: str,
    recipe: Recipe,
    run_dir: Path,
    inputs: dict[str, Path] | None = None,
    runtime: StagePlan | None = None,
    log: Any = None,
) -> StageContext:
    """A StageContext as the orchestrator builds it (stage folder `run_dir/<name>`, the plan's runtime)."""
    ctx = StageContext(
        name=name, recipe=resolved(recipe), runtime=runtime or planned_runtime(recipe, name), run_dir=run_dir,
        out_dir=run_dir / name, inputs=inputs or {},
    )
    if log is not None:
        ctx.log = log
    return ctx


def memorize(target_dir: str | Path, conversations: list[list[dict[str, Any]]], steps: int = 80) -> None:
    """Overfit the tiny target on whole conversations (a fraction of a second), so greedy decoding
    of each conversation's prompt reproduces its assistant turn: a random model that "thinks"."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(target_dir)
    enc = tok([tok.apply_chat_template(c, tokenize=False) for c in conversations], return_tensors="pt", padding=True)
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        model(**enc, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(target_dir)
