"""The generation backend interface and the one completion record shape both backends write.

A backend is a context manager (start/stop whatever it needs: servers, a model) with one method,
`generate(prompts, emit)`: it calls `emit(record)` once per finished prompt, in any order, with a
record built by `completion_record`. Transient failures are retried inside the backend; a prompt
that still fails is not emitted (so a resume retries it) and is counted in `stats.failed`; a
permanent rejection (e.g. HTTP 400: prompt longer than the context) is emitted with `error` set.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from dflashx.data import chat_mask
from dflashx.data.chat_mask import THINK_CLOSE

Emit = Callable[[dict[str, Any]], None]


def split_think(text: str, opened_in_prompt: bool = False) -> tuple[str, str]:
    """Split generated text into (reasoning, answer) at `</think>`.

    `opened_in_prompt`: the rendered prompt already ends with `<think>` (Qwen3.x templates with
    thinking on), so text without a closing tag is all reasoning (cut off by max_tokens)."""
    if opened_in_prompt and THINK_CLOSE not in text:
        return text.strip(), ""
    reasoning, answer, _balanced = chat_mask.split_think(text)
    return reasoning, answer


def completion_record(
    prompt: dict[str, Any],
    *,
    reasoning: str,
    answer: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    backend: str,
    error: str | None = None,
) -> dict[str, Any]:
    """A completion: the prompt's fields plus the generated text and its accounting."""
    record = {
        **prompt,
        "reasoning": reasoning,
        "answer": answer,
        "finish_reason": finish_reason,
        "usage": {"prompt_tokens": int(prompt_tokens), "completion_tokens": int(completion_tokens)},
        "backend": backend,
    }
    if error is not None:
        record["error"] = error
    return record


def rejected_record(prompt: dict[str, Any], error: str, backend: str, prompt_tokens: int = 0) -> dict[str, Any]:
    """A prompt refused for good (by the server, or before sending): written with `error`, no text."""
    return completion_record(prompt, reasoning="", answer="", finish_reason="error", prompt_tokens=prompt_tokens,
                             completion_tokens=0, backend=backend, error=error)


@dataclass
class BackendStats:
    retries: int = 0  # transient failures that were retried
    failed: int = 0  # prompts that still failed after every retry (not emitted)
    rejected: int = 0  # prompts the server refused for good (emitted with `error`)
    first_error: str | None = None
    spec_accept_length: float | None = None  # tokens per draft-verify cycle the servers reported (MTP on)
    server_restarts: int = 0  # launched servers started again after they exited while generating

    def note_error(self, message: str) -> None:
        self.first_error = self.first_error or message


class Backend(ABC):
    """One way of turning prompts into completions."""

    name: str = "base"
    drives: bool = True  # this process sends the prompts (False: a node that only serves, see `serve`)

    def __init__(self) -> None:
        self.stats = BackendStats()

    def serve(self) -> str:
        """Keep what this backend started up for another node until it stops; what stopped, in words."""
        raise NotImplementedError(f"the {self.name} backend only runs in-process")

    def __enter__(self) -> "Backend":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @abstractmethod
    def generate(self, prompts: Iterable[dict[str, Any]], emit: Emit) -> None:
        """Generate a completion for every prompt and `emit` each record as it finishes."""
