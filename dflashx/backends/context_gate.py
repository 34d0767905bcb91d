"""Refuse, before sending it, a prompt that cannot fit the server's context.

A prompt whose tokens as the target sees them (its chat template with the recipe's settings and a
generation prompt) plus `stages.generate.max_tokens` reach `stages.generate.context_length` would
come back HTTP 400 from SGLang (`--context-length` is that value; its tokenizer manager refuses
`input + max_new_tokens >= context_len` in `_validate_one_request`, some releases only above it or
by cutting `max_new_tokens`, so the gate takes the stricter bound) or overrun the model's positions
in transformers. The gate writes it as a rejected completion instead — finish_reason `error`, the
counts and the fix in `error` — so it costs no request, QC counts it (`rejected`), and a resumed
run skips it like any other written record.

Counting is cheap: a token covers at least one byte of text (byte-level BPE, and byte fallback),
so only a prompt whose rendered UTF-8 bytes already exceed the room is tokenized.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from dflashx.config.schema import ChatTemplateSpec, TargetSpec
from dflashx.data.chat_mask import render_prompt
from dflashx.targets.load import load_tokenizer

log = logging.getLogger(__name__)
Refuse = Callable[[dict[str, Any], int, str], None]  # (prompt, its tokens, error text)


class ContextGate:
    """Passes the prompts that fit `context_length` with `max_tokens` of room; refuses the others."""

    def __init__(self, tokenizer: Any, chat: ChatTemplateSpec, max_tokens: int, context_length: int) -> None:
        self.tokenizer = tokenizer
        self.chat = chat
        self.max_tokens = max_tokens
        self.context_length = context_length
        self.refused = 0

    def prompt_tokens(self, prompt: dict[str, Any]) -> int | None:
        """The prompt's tokens when it may not fit; None when its bytes alone show it fits."""
        text = render_prompt(self.tokenizer, prompt, self.chat)
        if len(text.encode("utf-8")) + self.max_tokens < self.context_length:
            return None
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def admit(self, prompts: Iterable[dict[str, Any]], refuse: Refuse) -> Iterator[dict[str, Any]]:
        for prompt in prompts:
            n = self.prompt_tokens(prompt)
            if n is not None and n + self.max_tokens >= self.context_length:
                self.refused += 1
                refuse(prompt, n, self.error(n))
                continue
            yield prompt

    def error(self, n: int) -> str:
        return (f"not sent: the prompt's {n:,} tokens + stages.generate.max_tokens {self.max_tokens:,} reach "
                f"stages.generate.context_length {self.context_length:,}; raise stages.generate.context_length "
                f"(up to the target's native context) or lower stages.generate.max_tokens")


def open_gate(target: TargetSpec, max_tokens: int, context_length: int) -> ContextGate | None:
    """The gate with the target's tokenizer, or None (with one warning) when it cannot be loaded:
    the server's own refusals (HTTP 400) are then what is counted."""
    try:

        tokenizer = load_tokenizer(target)
    except Exception as exc:  # noqa: BLE001 - a hub id without network, a folder without a tokenizer, ...
        log.warning("generate: prompts are not checked against stages.generate.context_length before they are "
                    "sent (the target's tokenizer could not be loaded: %s); the server's refusals are counted "
                    "instead", f"{type(exc).__name__}: {exc}".splitlines()[0])
        return None
    return ContextGate(tokenizer, target.chat_template, max_tokens, context_length)
