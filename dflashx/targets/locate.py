"""Where a recipe's target model and tokenizer are loaded from.

- `builtin:tiny-*` -> the built tiny target's folder (built and cached on first use); its tokenizer
  alone is located at the build's tokenizer folder, which takes seconds;
- a local folder -> that folder (it must hold a `config.json`);
- anything else is a Hugging Face hub id, returned as a path-like string that `from_pretrained`
  accepts as it is (`Path("Qwen/Qwen3-8B")` prints back as `Qwen/Qwen3-8B`); downloading is left to
  transformers / SGLang on the machine that loads it.
"""

from __future__ import annotations

from pathlib import Path

from dflashx.config.schema import TargetSpec

BUILTIN_PREFIX = "builtin:"


class TargetPathError(ValueError):
    """`target.model` / `target.tokenizer` names something that cannot be loaded."""


def _locate(value: str, key: str, tokenizer_only: bool = False) -> Path:
    if value.startswith(BUILTIN_PREFIX):
        from dflashx.tiny import MODEL_NAMES, locate_builtin, locate_builtin_tokenizer

        if value.removeprefix(BUILTIN_PREFIX) not in MODEL_NAMES:
            names = ", ".join(BUILTIN_PREFIX + n for n in MODEL_NAMES)
            raise TargetPathError(f"{key}: {value!r} is not a built-in target; use one of {names}")
        return locate_builtin_tokenizer(value) if tokenizer_only else locate_builtin(value)
    path = Path(value).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file() and key == "target.model":
            raise TargetPathError(f"{key}: folder {path} has no config.json; point it at a Hugging Face model folder")
        return path
    if path.exists() or value.startswith((".", "/", "~")) or value.count("/") > 1:
        raise TargetPathError(
            f"{key}: {value!r} is neither a model folder nor a hub id like 'Qwen/Qwen3-8B'; "
            "fix the path or use builtin:tiny-qwen3"
        )
    return Path(value)  # hub id: from_pretrained takes str(path) unchanged


def locate_target(target: TargetSpec) -> Path:
    """The folder (or hub id) the target model loads from; builds `builtin:tiny-*` on first use."""
    return _locate(target.model, "target.model")


def locate_tokenizer(target: TargetSpec) -> Path:
    """The tokenizer's folder (or hub id): `target.tokenizer` when set, else the model's.

    For `builtin:tiny-*` this is the build's tokenizer folder, made in seconds without the model.
    """
    if target.tokenizer:
        return _locate(target.tokenizer, "target.tokenizer", tokenizer_only=True)
    return _locate(target.model, "target.model", tokenizer_only=True)


def is_builtin(value: str) -> bool:
    return value.startswith(BUILTIN_PREFIX)


def builtin_identity(value: str) -> str:
    """What a `builtin:` value stands for (name, size, build key), cheaply and without building it."""
    from dflashx.tiny import builtin_identity as identity

    return identity(value)


def builtin_file(value: str) -> Path:
    """A `builtin:` data file (e.g. `builtin:tiny-prompts`), written on first use."""
    from dflashx.tiny import locate_builtin

    return locate_builtin(value)
