"""One thinking contract from generation to serving: which chat template, with thinking on or off.

A drafter serves well only when the text it was trained on was rendered the way the engine renders
it (z-lab dflash #60: acceptance collapses when thinking differs between data, training and
serving). Each stage that renders or consumes chat text records the contract it used
(`chat_contract.json` beside its artifact): the sha256 of the target tokenizer's chat template,
`enable_thinking` and the extra template kwargs. A stage whose input carries another contract
than the recipe's stops, naming both; the export writes the contract the drafter was trained for.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dflashx.config.schema import TargetSpec
from dflashx.store.atomic import atomic_write_json
from dflashx.targets.load import load_tokenizer

CONTRACT_FILE = "chat_contract.json"


class ContractMismatch(ValueError):
    """An input was rendered under another chat contract than the recipe's."""


@dataclass(frozen=True)
class ChatContract:
    template_sha256: str
    enable_thinking: bool
    template_kwargs: dict[str, Any]

    @classmethod
    def of(cls, template: str, enable_thinking: bool, kwargs: dict[str, Any]) -> "ChatContract":
        return cls(hashlib.sha256(template.encode()).hexdigest(), enable_thinking, dict(sorted(kwargs.items())))

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, enable_thinking: bool, kwargs: dict[str, Any]) -> "ChatContract":
        """The contract of a loaded tokenizer's chat template under the recipe's flags."""
        template = tokenizer.chat_template
        if not isinstance(template, str):
            raise ContractMismatch("the target tokenizer has no chat template; use a chat model's tokenizer")
        return cls.of(template, enable_thinking, kwargs)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (f"template sha256 {self.template_sha256[:12]}, enable_thinking={self.enable_thinking}"
                + (f", kwargs {self.template_kwargs}" if self.template_kwargs else ""))


def write(folder: Path, contract: ChatContract) -> Path:
    path = Path(folder) / CONTRACT_FILE
    atomic_write_json(path, contract.to_json())
    return path


def read(folder: Path) -> ChatContract | None:
    """The contract recorded in `folder` (or beside the file `folder`), None when none was."""
    folder = Path(folder)
    path = (folder if folder.is_dir() else folder.parent) / CONTRACT_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return ChatContract(data["template_sha256"], bool(data["enable_thinking"]), dict(data.get("template_kwargs") or {}))


def check(expected: ChatContract, folder: Path, what: str) -> None:
    """Stop when `folder` (an input artifact) was made under another contract than `expected`."""
    found = read(folder)
    if found is not None and found != expected:
        raise ContractMismatch(
            f"{what} ({folder}) was rendered with {found.describe()}, but this recipe renders with "
            f"{expected.describe()}: training on it would teach the drafter text the engine never shows it. "
            "Set target.chat_template (and the target's tokenizer) back to what made it, or regenerate it "
            "(run the producing stage again with --force)")


def recipe_contract(target: TargetSpec) -> ChatContract:
    """The contract the recipe renders with: its target tokenizer's template and its flags."""

    tokenizer = load_tokenizer(target)
    chat = target.chat_template
    return ChatContract.for_tokenizer(tokenizer, chat.enable_thinking, chat.kwargs)
