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
    """Tokenizer folder of `builtin:tiny-qwen3` / `builtin:tiny-qwen3_5` without building the model: the model's
    own folder when its build is cached or ships in the package under the current key (a copy, a fraction of a
    second: its tokenizer files are the ones `ensure_tiny_tokenizer` trains), else the tokenizer alone (trained
    in seconds)."""
    from dflashx.tiny.build import ensure_tiny_tokenizer
    from dflashx.tiny.shipped import record_under

    name = value.removeprefix(BUILTIN_PREFIX)
    if name not in MODEL_NAMES:
        raise ValueError(f"{value!r} has no tokenizer; use one of {', '.join(BUILTIN_PREFIX + n for n in MODEL_NAMES)}")
    variant, small = UPCYCLED.get(name, name), _small()
    if record_under(variant, _build_key(variant, small)) is not None or _cached(variant, small) is not None:
        return locate_builtin(BUILTIN_PREFIX + variant)
    return ensure_tiny_tokenizer(variant, small=small)


def builtin_identity(value: str) -> str:
    """What a `builtin:` value stands for (name, size, build key), cheaply and without building.

    Stage keys use it, so a rebuilt tiny target (new code or settings, or the small CI size)
    re-runs the stages that read it. A model's identity is also its cache folder's name.
    """
    name = value.removeprefix(BUILTIN_PREFIX)
    return _folder_name(name, _small() and name in MODEL_NAMES)


def _folder_name(name: str, small: bool) -> str:
    """`<name>[-small]-<build key>`: a builtin's identity, and a model builtin's cache folder."""
    return f"{name}{'-small' if small else ''}-{_build_key(name, small)}"


@functools.lru_cache(maxsize=32)
def _build_key(name: str, small: bool) -> str:
    """A builtin's build key (a model's, the upcycled one's, else the default build's), once per name and size per
    process: a key parses the build's sources (~20 ms), and a run asks ~100 times (every stage key, progress
    write and target location); the sources do not change under it."""
    from dflashx.tiny.build import BuildSettings, build_key

    if name in UPCYCLED:
        from dflashx.tiny.moe import moe_key

        return moe_key(small)
    return build_key(BuildSettings.for_variant(name, small) if name in MODEL_NAMES else BuildSettings())


def _cached(name: str, small: bool) -> Path | None:
    """A model builtin's cache folder when its build under the current key is there."""
    from dflashx.tiny.build import _is_built, cache_root

    folder = cache_root() / _folder_name(name, small)
    return folder if _is_built(folder, _build_key(name, small)) else None


def locate_builtin(value: str) -> Path:
    """Local path for a `builtin:` value (model folder or prompt JSONL), built/written on first use."""
    from dflashx.tiny.build import cache_root
    from dflashx.tiny.prompts import PROMPT_FILES, write_prompt_file

    name = value.removeprefix(BUILTIN_PREFIX)
    if name in MODEL_NAMES and (folder := _cached(name, _small())) is not None:
        return folder  # built under the current key: no build lock to take
    if name in UPCYCLED:
        from dflashx.tiny.moe import ensure_tiny_moe

        return ensure_tiny_moe(small=_small(), log=logging.getLogger("dflashx.tiny").info)
    if name in MODEL_NAMES:
        from dflashx.tiny.build import ensure_tiny_target

        return ensure_tiny_target(name, small=_small(), log=logging.getLogger("dflashx.tiny").info)
    if name in PROMPT_FILES:
        return write_prompt_file(name, cache_root() / f"prompts-{_build_key(name, False)}")
    known = ", ".join(BUILTIN_PREFIX + n for n in (*MODEL_NAMES, *PROMPT_FILES))
    raise ValueError(f"unknown builtin {value!r}; known builtins are {known}")
