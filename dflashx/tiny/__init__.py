"""The embedded default's target: a tiny thinking chat model built from a synthetic corpus.

`locate_builtin` turns the `builtin:` values recipes use into local paths, on first use copying
the build shipped in the package (`dflashx.tiny.shipped`) or, when the build code changed since,
building it:

- `builtin:tiny-qwen3`, `builtin:tiny-qwen3_5` -> the built model folder (HF layout);
- `builtin:tiny-qwen3_moe` -> tiny-qwen3 upcycled into a qwen3_moe target (`dflashx.tiny.moe`, seconds);
- `builtin:tiny-prompts` -> JSONL of generation prompt records;
- `builtin:tiny-eval-prompts` -> JSONL of held-out prompts with the reference `answer`.

`locate_builtin_tokenizer` gives a model builtin's tokenizer folder in seconds (no model build).

Building imports torch and transformers; locating a prompt file does not. `DFLASHX_TINY_SIZE=small`
makes the model builtins stand for the small CI size (same depth and layer types, narrower), for
end-to-end tests that cannot spend minutes on the full build.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

BUILTIN_PREFIX = "builtin:"
MODEL_NAMES = ("tiny-qwen3", "tiny-qwen3_5", "tiny-qwen3_moe")
UPCYCLED = {"tiny-qwen3_moe": "tiny-qwen3"}  # an upcycled builtin -> the dense build it is made from


def _small() -> bool:
    size = os.environ.get("DFLASHX_TINY_SIZE", "full")
    if size not in ("full", "small"):
        raise ValueError(f"DFLASHX_TINY_SIZE={size!r}: use 'full' (default) or 'small'")
    return size == "small"


def locate_builtin_tokenizer(value: str) -> Path:
    """Tokenizer folder of `builtin:tiny-qwen3` / `builtin:tiny-qwen3_5` without building the model."""
    from dflashx.tiny.build import ensure_tiny_tokenizer

    name = value.removeprefix(BUILTIN_PREFIX)
    if name not in MODEL_NAMES:
        raise ValueError(f"{value!r} has no tokenizer; use one of {', '.join(BUILTIN_PREFIX + n for n in MODEL_NAMES)}")
    return ensure_tiny_tokenizer(UPCYCLED.get(name, name), small=_small())


def builtin_identity(value: str) -> str:
    """What a `builtin:` value stands for (name, size, build key), cheaply and without building.

    Stage keys use it, so a rebuilt tiny target (new code or settings, or the small CI size)
    re-runs the stages that read it.
    """
    return _identity(value.removeprefix(BUILTIN_PREFIX), _small())


@functools.lru_cache(maxsize=32)
def _identity(name: str, small: bool) -> str:
    """One build key per name and size per process: a key parses the build's sources (~20 ms), and a
    run asks for it ~100 times (every stage key and progress write); the sources do not change under it."""
    from dflashx.tiny.build import BuildSettings, build_key

    if name in UPCYCLED:
        from dflashx.tiny.moe import moe_key

        return f"{name}{'-small' if small else ''}-{moe_key(small)}"
    if name in MODEL_NAMES:
        return f"{name}{'-small' if small else ''}-{build_key(BuildSettings.for_variant(name, small))}"
    return f"{name}-{build_key(BuildSettings())}"


def locate_builtin(value: str) -> Path:
    """Local path for a `builtin:` value (model folder or prompt JSONL), built/written on first use."""
    from dflashx.tiny.build import cache_root
    from dflashx.tiny.prompts import PROMPT_FILES, write_prompt_file

    name = value.removeprefix(BUILTIN_PREFIX)
    if name in UPCYCLED:
        from dflashx.tiny.moe import ensure_tiny_moe

        return ensure_tiny_moe(small=_small(), log=logging.getLogger("dflashx.tiny").info)
    if name in MODEL_NAMES:
        from dflashx.tiny.build import ensure_tiny_target

        return ensure_tiny_target(name, small=_small(), log=logging.getLogger("dflashx.tiny").info)
    if name in PROMPT_FILES:
        from dflashx.tiny.build import build_key, BuildSettings

        return write_prompt_file(name, cache_root() / f"prompts-{build_key(BuildSettings())}")
    known = ", ".join(BUILTIN_PREFIX + n for n in (*MODEL_NAMES, *PROMPT_FILES))
    raise ValueError(f"unknown builtin {value!r}; known builtins are {known}")
