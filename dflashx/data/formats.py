"""Source record shapes -> one prompt shape: `{"messages": [...], "tools"?: [...]}`.

Supported shapes (a source's `format`, or `auto` to detect per record):

- `messages`: OpenAI chat, `{"messages": [{"role", "content"}], "tools"?}`; content may be a list
  of `{"type": "text", "text"}` parts (`fields: {messages: <key>}` when the list has another name).
- `sharegpt`: `{"conversations": [{"from": "human"|"gpt"|"system"|..., "value"}]}`.
- `alpaca`: `{"instruction", "input"?, "output"?, "system"?}`; the source's `fields` renames keys,
  e.g. `{prompt: question, system: system_prompt}` for OpenOrca.
- `function_calling`: a `messages` or `conversations` record with tool definitions in `tools`
  (a list or a JSON string) or the legacy `functions`; or the Glaive layout, `{"system": "SYSTEM:
  ... -\\n{json function}...", "chat": "USER: ... ASSISTANT: ..."}`.
- `prompt`: one user turn from a plain text field (`fields.prompt`, default `prompt`).

The prompt is everything up to and including the last user turn: assistant answers in source data
are dropped because the target regenerates them. The system prompt is kept, and a source-level
`system_prompt` is added to samples that have none. `sample_id` hashes the normalised prompt.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

FORMATS = ("messages", "sharegpt", "alpaca", "function_calling", "prompt")
ROLES = ("system", "user", "assistant", "tool")

_SHAREGPT_ROLES = {
    "system": "system",
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "model": "assistant",
    "bing": "assistant", "bard": "assistant",
    "tool": "tool", "function": "tool", "function_response": "tool", "observation": "tool",
    "function_call": "assistant",
}
_DEFAULT_FIELDS = {
    "alpaca": {"prompt": "instruction", "input": "input", "system": "system"},
    "prompt": {"prompt": "prompt", "input": "input", "system": "system"},
}
_GLAIVE_TURN = re.compile(r"(USER|ASSISTANT|FUNCTION RESPONSE):")
_GLAIVE_ROLES = {"USER": "user", "ASSISTANT": "assistant", "FUNCTION RESPONSE": "tool"}


class FormatError(ValueError):
    """A record does not have the shape its source's format expects (message says how to fix)."""


def detect_format(record: dict[str, Any]) -> str:
    """Guess a record's format from its keys (used for `format: auto`)."""
    if ("chat" in record and "system" in record) or "tools" in record or "functions" in record:
        return "function_calling"
    if "messages" in record:
        return "messages"
    if "conversations" in record:
        return "sharegpt"
    if "instruction" in record:
        return "alpaca"
    if "prompt" in record:
        return "prompt"
    raise FormatError(
        f"cannot detect the format from keys {sorted(record)}; set the source's `format` "
        f"(one of {', '.join(FORMATS)}) and `fields` if the keys are renamed"
    )


def to_prompt(
    record: dict[str, Any],
    fmt: str = "auto",
    fields: dict[str, str] | None = None,
    system_prompt: str | None = None,
) -> dict[str, Any]:
    """Normalise one source record to `{"messages": [...], "tools"?: [...]}` (raises FormatError)."""
    if not isinstance(record, dict):
        raise FormatError(f"expected a JSON object, got {type(record).__name__}")
    fmt = detect_format(record) if fmt == "auto" else fmt
    fields = fields or {}
    tools: list[Any] = []
    if fmt == "messages":
        messages = _openai_messages(_require(record, fields.get("messages", "messages"), fmt))
        tools = _tools(record)
    elif fmt == "sharegpt":
        messages = _sharegpt_messages(_require(record, fields.get("conversations", "conversations"), fmt))
    elif fmt in _DEFAULT_FIELDS:
        messages = _instruction_messages(record, fmt, {**_DEFAULT_FIELDS[fmt], **fields})
    elif fmt == "function_calling":
        messages, tools = _function_calling(record)
    else:
        raise FormatError(f"unknown format {fmt!r}; use one of auto, {', '.join(FORMATS)}")
    messages = _up_to_last_user(messages)
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    prompt: dict[str, Any] = {"messages": messages}
    if tools:
        prompt["tools"] = tools
    return prompt


def sample_id(prompt: dict[str, Any]) -> str:
    """Stable id: sha256 of the canonical JSON of the normalised prompt (20 hex digits)."""
    canonical = json.dumps(
        {"messages": prompt["messages"], "tools": prompt.get("tools", [])},
        sort_keys=True, ensure_ascii=False, separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:20]


# --------------------------------------------------------------------------- per-format readers


def _require(record: dict[str, Any], key: str, fmt: str) -> Any:
    if key not in record or record[key] in (None, "", []):
        raise FormatError(
            f"format {fmt!r} needs key {key!r}; keys present: {sorted(record)} "
            f"(set the source's `format`, or map keys with `fields`)"
        )
    return record[key]


def _text(content: Any) -> str:
    """Message content as text: a string, or the text parts of an OpenAI content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text"]
        return "".join(parts)
    if content is None:
        return ""
    raise FormatError(f"message content must be a string or a list of text parts, got {type(content).__name__}")


def _openai_messages(raw: Any) -> list[dict[str, str]]:
    if not isinstance(raw, list):
        raise FormatError(f"`messages` must be a list, got {type(raw).__name__}")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or "role" not in m:
            raise FormatError(f"messages[{i}] must be an object with `role` and `content`")
        role = m["role"]
        if role not in ROLES:
            raise FormatError(f"messages[{i}].role is {role!r}; expected one of {', '.join(ROLES)}")
        messages.append({"role": role, "content": _text(m.get("content"))})
    return messages


def _sharegpt_messages(raw: Any) -> list[dict[str, str]]:
    if not isinstance(raw, list):
        raise FormatError(f"`conversations` must be a list, got {type(raw).__name__}")
    messages = []
    for i, turn in enumerate(raw):
        if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
            raise FormatError(f"conversations[{i}] must be an object with `from` and `value`")
        role = _SHAREGPT_ROLES.get(str(turn["from"]).lower())
        if role is None:
            raise FormatError(
                f"conversations[{i}].from is {turn['from']!r}; expected one of {', '.join(sorted(_SHAREGPT_ROLES))}"
            )
        messages.append({"role": role, "content": _text(turn["value"])})
    return messages


def _instruction_messages(record: dict[str, Any], fmt: str, fields: dict[str, str]) -> list[dict[str, str]]:
    """Alpaca / plain prompt: one user turn from `fields.prompt` (+ `fields.input`), optional system."""
    key = fields["prompt"]
    instruction = record.get(key)
    if not isinstance(instruction, str) or not instruction.strip():
        raise FormatError(
            f"{fmt} format needs a non-empty text in {key!r} (fields.prompt); keys present: {sorted(record)}"
            f" (map the prompt key with `fields: {{prompt: <key>}}`)"
        )
    extra = record.get(fields["input"])
    user = f"{instruction}\n\n{extra}" if isinstance(extra, str) and extra.strip() else instruction
    messages = [{"role": "user", "content": user}]
    system = record.get(fields["system"])
    if isinstance(system, str) and system.strip():
        messages.insert(0, {"role": "system", "content": system})
    return messages


def _tools(record: dict[str, Any]) -> list[Any]:
    raw = record.get("tools", record.get("functions"))
    if raw in (None, "", []):
        return []
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as e:
            raise FormatError(f"`tools` is a string but not JSON: {e}") from None
    if not isinstance(raw, list):
        raise FormatError(f"`tools` must be a list of tool definitions, got {type(raw).__name__}")
    return [t if isinstance(t, dict) and "type" in t else {"type": "function", "function": t} for t in raw]


def _function_calling(record: dict[str, Any]) -> tuple[list[dict[str, str]], list[Any]]:
    if "messages" in record:
        return _openai_messages(record["messages"]), _tools(record)
    if "conversations" in record:
        return _sharegpt_messages(record["conversations"]), _tools(record)
    if "chat" in record:
        return _glaive(record)
    raise FormatError(
        f"function_calling needs `messages` or `conversations` (+ `tools`), or Glaive's `system` + `chat`;"
        f" keys present: {sorted(record)}"
    )


def _glaive(record: dict[str, Any]) -> tuple[list[dict[str, str]], list[Any]]:
    """Glaive function-calling v2: tool JSON objects inside the system text, turns in one string."""
    system_text = re.sub(r"^\s*SYSTEM:\s*", "", str(record.get("system") or ""))
    tools: list[Any] = []
    decoder = json.JSONDecoder()
    brace = system_text.find("{")
    prose = system_text if brace < 0 else system_text[:brace]
    while brace >= 0:
        try:
            obj, end = decoder.raw_decode(system_text, brace)
        except json.JSONDecodeError as e:
            raise FormatError(f"a tool definition in `system` is not valid JSON: {e}") from None
        tools.append({"type": "function", "function": obj})
        brace = system_text.find("{", end)
    messages = []
    if prose.strip():
        messages.append({"role": "system", "content": prose.strip().rstrip("-").strip()})
    pieces = _GLAIVE_TURN.split(str(record["chat"]))
    for marker, text in zip(pieces[1::2], pieces[2::2], strict=True):
        text = text.replace("<|endoftext|>", "").strip()
        messages.append({"role": _GLAIVE_ROLES[marker], "content": text})
    return messages, tools


def _up_to_last_user(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """Drop everything after the last user turn; require a non-empty one."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    if last < 0:
        raise FormatError("no user turn: a prompt needs at least one message with role 'user'")
    if not messages[last]["content"].strip():
        raise FormatError("the last user turn is empty")
    return [dict(m) for m in messages[: last + 1]]
