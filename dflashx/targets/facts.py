"""The target facts a recipe plans with: a local folder's config.json (mask token and thinking
mode from its tokenizer files), else the registry (`target.model`, then `target.arch`). Reads files, no torch."""

from __future__ import annotations

import json
from pathlib import Path

from dflashx.config.schema import TargetSpec
from dflashx.targets.read_config import ConfigFactsError, facts_from_config, mask_token_from_tokenizer
from dflashx.targets.registry import TargetFacts, lookup


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def _with_mask_token(facts: TargetFacts, target: TargetSpec) -> TargetFacts:
    """Facts whose mask token comes from the target's tokenizer when the registry has none."""
    if facts.mask_token_id is not None:
        return facts
    for folder in (Path(p) for p in (target.tokenizer, target.model) if p):
        mask = mask_token_from_tokenizer(_read_json(folder / "tokenizer.json"),
                                         _read_json(folder / "tokenizer_config.json"))
        if mask is not None:
            return facts.model_copy(update={"mask_token_id": mask})
    return facts


def _chat_template(folder: Path) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8", errors="replace")
    template = (_read_json(folder / "tokenizer_config.json") or {}).get("chat_template")
    return template if isinstance(template, str) else None


def _added_tokens(folder: Path) -> dict[str, int]:
    found: dict[str, int] = {}
    for token in (_read_json(folder / "tokenizer.json") or {}).get("added_tokens") or []:
        found.setdefault(str(token.get("content")), int(token["id"]))
    return found


# How a chat template shows a thinking/reasoning channel: Qwen3's `enable_thinking` switch, gpt-oss
# harmony's `<|channel|>` (its `analysis` channel carries the reasoning).
THINKING_MARKS = ("enable_thinking", "<|channel|>")


def _with_template(facts: TargetFacts, target: TargetSpec) -> TargetFacts:
    """From a local target's chat template: whether it has a thinking/reasoning channel and
    which special tokens it writes (a mask token must not be one of them)."""
    for folder in (Path(p) for p in (target.tokenizer, target.model) if p):
        template = _chat_template(folder)
        if template is not None:
            emitted = sorted(i for text, i in _added_tokens(folder).items() if text in template)
            return facts.model_copy(update={"thinking": any(mark in template for mark in THINKING_MARKS),
                                            "template_token_ids": emitted})
    return facts


def registry_facts(target: TargetSpec) -> TargetFacts | None:
    """The registry's facts for `target` (`target.model`, then `target.arch`): pure, no file read. The
    one rule `facts_for` and the planner (`make_plan` without facts) fall back to."""
    return lookup(target.model) or (lookup(target.arch) if target.arch else None)


def facts_for(target: TargetSpec) -> TargetFacts | None:
    """Facts for `target`, or None when it is unknown. Raises `ConfigFactsError` (naming the file)
    when a local config.json is unreadable and `target.arch` names no known architecture."""
    config = Path(target.model) / "config.json"
    if not config.is_file():
        return registry_facts(target)
    try:
        facts = facts_from_config(json.loads(config.read_text(encoding="utf-8")), name=target.model)
    except (ConfigFactsError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        known = registry_facts(target) if target.arch else None
        if known is None:
            raise ConfigFactsError(f"{config}: {exc} (target.model)") from exc
        return known
    return _with_template(_with_mask_token(facts, target), target)
