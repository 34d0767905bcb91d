"""One place that removes secrets from everything dflashx writes: recipes, plans, provenance,
records, W&B config, command lines and log lines.

Two rules, applied together by `redact`:
- by name: a string under a mapping key, or `NAME=value`, whose name looks like a credential (its
  last word is key/token/secret/password/..., it contains secret/password/credential anywhere, or
  it starts with AWS_); `mask_token_id`, `max_tokens` or `tokenizer` are not credentials, and
  numbers never are (`output_bytes_per_token: 4.0` stays readable in plan.json).
- by value: strings that look like AWS access key ids, GitHub/HF/OpenAI-style tokens, URL
  passwords, long hex (>= 32, e.g. W&B keys) or long mixed base64 (>= 32, e.g. AWS secret keys),
  and the literal values of credential-named environment variables wherever they appear.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "***REDACTED***"

_LAST_WORDS = {"key", "keys", "token", "secret", "password", "passwd", "credential",
               "credentials", "apikey", "auth", "cookie", "signature", "passphrase"}
_ANY_WORDS = {"secret", "password", "passwd", "credential", "credentials", "apikey", "privatekey"}
_NAME_PREFIXES = ("AWS_",)
_NOT_SECRET = {"AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_ENDPOINT_URL"}

_VALUE_PATTERNS = [
    re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b"),  # AWS key ids
    re.compile(r"\b(?:ghp|gho|ghs|ghu|github_pat|hf|sk|xox[abpr])[_-][A-Za-z0-9_-]{20,}"),
    re.compile(r"(?<![0-9a-fA-F])[0-9a-fA-F]{32,}(?![0-9a-fA-F])"),  # hex tokens (W&B keys)
    # base64-ish runs of >= 32 with upper, lower and digit (AWS secret keys), not path-like
    re.compile(r"(?<![A-Za-z0-9/+=_-])(?=[A-Za-z0-9/+=]*[A-Z])(?=[A-Za-z0-9/+=]*[a-z])"
               r"(?=[A-Za-z0-9/+=]*[0-9])(?!/)[A-Za-z0-9/+=]{32,}(?![A-Za-z0-9/+=_-])"),
]
_URL_PASSWORD = re.compile(r"(://[^:/@\s]+:)[^@\s/]+@")
_ASSIGNMENT = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P<sep>\s*[=:]\s*)"
                         r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s,;&]+)")
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


def _words(name: str) -> list[str]:
    return [w.lower() for w in _WORD_SPLIT.split(name) if w]


def is_secret_name(name: str) -> bool:
    """Whether a variable/key name looks like it holds a credential."""
    if name.upper() in _NOT_SECRET:
        return False
    if name.upper().startswith(_NAME_PREFIXES):
        return True
    words = _words(name.rsplit(".", 1)[-1])
    return bool(words) and (words[-1] in _LAST_WORDS or any(w in _ANY_WORDS for w in words))


def known_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values (8+ chars) of credential-named environment variables, longest first."""
    environ = os.environ if environ is None else environ
    values = {v for k, v in environ.items() if is_secret_name(k) and len(v) >= 8}
    return sorted(values, key=len, reverse=True)


def redact_text(text: str, secrets: Iterable[str] | None = None) -> str:
    """Redact secret-looking values, `name=value` credentials and known secret values in text."""
    for value in known_secrets() if secrets is None else secrets:
        text = text.replace(value, REDACTED)
    text = _URL_PASSWORD.sub(rf"\g<1>{REDACTED}@", text)
    text = _ASSIGNMENT.sub(
        lambda m: m.group(0) if not is_secret_name(m.group("name")) or m.group("value") == REDACTED
        else f"{m.group('name')}{m.group('sep')}{REDACTED}", text)
    for pattern in _VALUE_PATTERNS:
        text = pattern.sub(REDACTED, text)
    return text


def redact(obj: Any, secrets: Iterable[str] | None = None) -> Any:
    """A copy of `obj` (dicts, lists, strings, scalars) with every secret replaced by REDACTED."""
    secrets = known_secrets() if secrets is None else list(secrets)
    if isinstance(obj, Mapping):
        return {k: (REDACTED if is_secret_name(str(k)) and isinstance(v, str) and v
                    else redact(v, secrets)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact(v, secrets) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj, secrets)
    return obj


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line with `--token VALUE`, `--token=VALUE` and `key=VALUE` secrets redacted."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("-") and "=" not in arg and is_secret_name(arg.lstrip("-")):
            hide_next = True
        out.append(redact_text(arg))
    return out


class RedactingFilter(logging.Filter):
    """A logging filter that redacts each record's formatted message (add it to handlers)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact_text(message)
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


def install_console_logging(level: int = logging.WARNING) -> logging.Handler:
    """Give the `dflashx` loggers one redacting stderr handler (idempotent; the CLI calls it)."""
    logger = logging.getLogger("dflashx")
    for handler in logger.handlers:
        if getattr(handler, "dflashx_console", False):
            return handler
    handler = logging.StreamHandler()
    handler.dflashx_console = True  # type: ignore[attr-defined]
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())
    logger.addHandler(handler)
    return handler
