"""Build the tiny target: corpus -> tokenizer -> model -> training -> evaluation -> HF folder.

A build is deterministic for given settings (seeded corpus, tokenizer, init and batch order) and is
cached in a content-addressed folder, `<cache>/tiny/<variant>-<key>`, where the key hashes the build
settings and the source of this package. The folder is written in a temporary sibling and renamed
into place, so a reader never sees half a model, under a lock file, so two processes never build
the same folder twice. `<cache>` is `$DFLASHX_CACHE` or `~/.cache/dflashx`.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

MASK_TOKEN_ID = 5  # `<|mask|>`: the sixth special token, never seen in the corpus

_LINEAR = {"linear_conv_kernel_dim": 4, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
           "linear_key_head_dim": 32, "linear_value_head_dim": 32}

# Exact model configs (copied by the planner's registry). `small` is the CI build.
VARIANTS: dict[str, dict[str, Any]] = {
    "tiny-qwen3": {
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
        "num_hidden_layers": 6, "hidden_size": 192, "num_attention_heads": 6, "num_key_value_heads": 2,
        "head_dim": 32, "intermediate_size": 512, "vocab_size": 1024,
        "layer_types": ["full_attention"] * 6,
    },
    "tiny-qwen3_5": {
        "model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"],
        "num_hidden_layers": 6, "hidden_size": 192, "num_attention_heads": 6, "num_key_value_heads": 2,
        "head_dim": 32, "intermediate_size": 512, "vocab_size": 1024,
        "layer_types": ["linear_attention", "linear_attention", "full_attention"] * 2, **_LINEAR,
    },
}
# The small size keeps the depth and layer types (so layer ids planned for a variant stay valid).
SMALL = {"hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 192}
_COMMON = {"max_position_embeddings": 1024, "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
           "bos_token_id": None, "eos_token_id": 2, "pad_token_id": 0}


@dataclasses.dataclass(frozen=True)
class BuildSettings:
    """Everything that determines a build's result (hashed into the cache key)."""

    variant: str = "tiny-qwen3"
    small: bool = False
    seed: int = 0
    train_examples: int = 24_000
    thinking_off_share: float = 0.15
    steps: int = 2000
    batch_size: int = 32
    lr: float = 2e-3
    eval_per_family: int = 16
    max_new_tokens: int = 160

    @classmethod
    def for_variant(cls, variant: str, small: bool = False) -> "BuildSettings":
        if variant not in VARIANTS:
            raise ValueError(f"unknown tiny variant {variant!r}; choose one of {', '.join(VARIANTS)}")
        if small:
            return cls(variant=variant, small=True, train_examples=3000, steps=400, batch_size=16, lr=5e-3,
                       eval_per_family=4)
        return cls(variant=variant)


def model_config(variant: str, small: bool = False) -> dict[str, Any]:
    """The config.json fields of a variant (the small CI size when `small`)."""
    cfg = {**VARIANTS[variant], **_COMMON}
    if small:
        cfg.update(SMALL)
    return cfg


# The modules whose code decides what a build produces (resolving and prompt-file code does not).
_BUILD_SOURCES = ("build.py", "corpus.py", "tokenizer.py", "train.py")


def cache_root() -> Path:
    return Path(os.environ.get("DFLASHX_CACHE") or Path.home() / ".cache" / "dflashx") / "tiny"


_PARSE_LOCK = threading.Lock()


def syntax_text(node: Any) -> str:
    """A syntax tree as text that every supported Python (3.11 to 3.13) writes alike: node names and
    their fields, leaving out empty and unset ones (`ast.dump` does not: 3.12 adds `type_params=[]` to
    every function and class, 3.13 drops empty fields), never line numbers or comments."""
    if isinstance(node, ast.AST):
        fields = ((f, getattr(node, f, None)) for f in node._fields)
        return f"{type(node).__name__}(" + ",".join(f"{f}={syntax_text(v)}" for f, v in fields
                                                     if v is not None and v != []) + ")"
    if isinstance(node, list):
        return "[" + ",".join(syntax_text(v) for v in node) + "]"
    return repr(node)


def build_key(settings: BuildSettings | dict[str, Any]) -> str:
    """sha256 of the settings and the code of the modules that make the build, 12 hex digits. The code is
    hashed as its syntax tree (`syntax_text`): re-wrapping lines or editing comments keeps the key (and the
    shipped build), and so does the Python version."""
    fields = dataclasses.asdict(settings) if isinstance(settings, BuildSettings) else settings
    h = hashlib.sha256(json.dumps(fields, sort_keys=True).encode())
    for name in _BUILD_SOURCES:
        src = Path(__file__).parent / name
        with _PARSE_LOCK:  # CPython 3.11's ast.parse is not thread-safe (gh-106905); preflight checks run in threads
            tree = ast.parse(src.read_text(), name)
        h.update(src.name.encode() + syntax_text(tree).encode())
    return h.hexdigest()[:12]


def _is_built(folder: Path, key: str) -> bool:
    report = folder / "build_report.json"
    return report.is_file() and json.loads(report.read_text()).get("key") == key


@contextlib.contextmanager
def _exclusive(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on `lock_file` (released when the process dies, too)."""
    with open(lock_file, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_atomically(dest: Path, key: str, fill: Callable[[Path], None], log: Callable[[str], None]) -> Path:
    """Run `fill(tmp)` in a temporary sibling of `dest`, then rename it into place.

    One process builds a given folder at a time: a second one waits on a lock file next to it and
    then finds the finished build instead of training the same model again.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    lock = dest.parent / f".{dest.name}.lock"
    with _exclusive(lock):
        if _is_built(dest, key):
            log(f"built meanwhile by another process: {dest}")
        else:
            _fill_and_rename(dest, key, fill)
        lock.unlink(missing_ok=True)  # built: later callers return before they lock
    return dest


def _fill_and_rename(dest: Path, key: str, fill: Callable[[Path], None]) -> None:
    """`fill` a temporary sibling of `dest`, then rename it to `dest` (an empty or missing folder)."""
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} exists and holds no build with key {key}; remove it or pick another --out")
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        fill(tmp)
        if dest.exists():
            dest.rmdir()  # empty: checked above
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ensure_tiny_tokenizer(variant: str = "tiny-qwen3", *, small: bool = False) -> Path:
    """The tokenizer folder of a variant's build: the same files the model folder gets, in seconds.

    Stages that need only the tokenizer (QC, tokenize) use this and skip the model build.
    """
    settings = BuildSettings.for_variant(variant, small)
    fields = {"tokenizer": True, "seed": settings.seed, "train_examples": settings.train_examples,
              "vocab_size": VARIANTS[variant]["vocab_size"]}
    key = build_key(fields)
    dest = cache_root() / f"tokenizer-{key}"
    if _is_built(dest, key):
        return dest

    def fill(tmp: Path) -> None:
        from dflashx.tiny import corpus
        from dflashx.tiny.tokenizer import train_tokenizer

        exs = corpus.examples("train", settings.train_examples, settings.seed)
        tok = train_tokenizer(_tokenizer_texts(exs, settings.seed), fields["vocab_size"], tmp)
        assert tok.convert_tokens_to_ids("<|mask|>") == MASK_TOKEN_ID
        (tmp / "build_report.json").write_text(json.dumps({"key": key, "settings": fields}, indent=2))

    return _build_atomically(dest, key, fill, lambda _: None)


def target_dir(variant: str, small: bool = False) -> Path:
    """The cache folder of a variant's build under the current build key."""
    key = build_key(BuildSettings.for_variant(variant, small))
    return cache_root() / f"{variant}{'-small' if small else ''}-{key}"


def ensure_tiny_target(variant: str = "tiny-qwen3", *, small: bool = False, out: Path | None = None,
                       log: Callable[[str], None] = lambda _: None, shipped: bool = True) -> Path:
    """Return the folder of the built target, making it first when it is not there yet: a copy of
    the build shipped in the package when it was made under the current key (`shipped`, seconds),
    else a build from the code (minutes)."""
    from dflashx.tiny import shipped as package

    settings = BuildSettings.for_variant(variant, small)
    key = build_key(settings)
    dest = Path(out) if out is not None else target_dir(variant, small)
    if _is_built(dest, key):
        log(f"cached: {dest}")
        return dest

    def fill(tmp: Path) -> None:
        if shipped and package.copy_into(variant, key, tmp):
            log(f"{variant}: the build shipped in the package (key {key}), checked against its sha256 record")
        else:
            _build(settings, key, tmp, log)

    return _build_atomically(dest, key, fill, log)


def _build(settings: BuildSettings, key: str, out: Path, log: Callable[[str], None]) -> None:
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from dflashx.tiny import corpus, train

    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.manual_seed(settings.seed)
    exs = corpus.examples("train", settings.train_examples, settings.seed)
    tok = AutoTokenizer.from_pretrained(ensure_tiny_tokenizer(settings.variant, small=settings.small))
    tok.save_pretrained(out)
    data = train.encode_corpus(tok, exs, settings.seed, settings.thinking_off_share)
    cfg_dict = model_config(settings.variant, settings.small)
    config = AutoConfig.for_model(**{k: v for k, v in cfg_dict.items() if k != "architectures"})
    config.architectures = cfg_dict["architectures"]
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config)
    log(f"{settings.variant}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, "
        f"{len(data)} examples, {settings.steps} steps")
    stats = train.train(model, data, steps=settings.steps, batch_size=settings.batch_size, lr=settings.lr,
                        seed=settings.seed, pad_id=tok.pad_token_id,
                        log=lambda s, loss: log(f"step {s}/{settings.steps} loss {loss:.4f}"))
    t_train = time.perf_counter() - t0
    held_out = corpus.examples("eval", settings.eval_per_family * len(corpus.FAMILIES), settings.seed)
    thinking = train.evaluate(model, tok, held_out, True, settings.max_new_tokens, settings.seed)
    no_think = train.evaluate(model, tok, held_out, False, settings.max_new_tokens, settings.seed)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                               do_sample=False, max_new_tokens=256)
    model.save_pretrained(out)
    report = {
        "key": key, "settings": dataclasses.asdict(settings), "config": cfg_dict,
        "mask_token_id": MASK_TOKEN_ID, "params": sum(p.numel() for p in model.parameters()),
        "train": stats, "train_seconds": round(t_train, 1),
        "build_seconds": round(time.perf_counter() - t0, 1), "torch_threads": threads,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "eval_thinking": thinking, "eval_no_thinking": no_think,
    }
    (out / "build_report.json").write_text(json.dumps(report, indent=2))
    log(f"accuracy (thinking) {thinking['overall']['accuracy']:.3f}, well-formed "
        f"{thinking['overall']['well_formed']:.3f}, {report['build_seconds']:.0f}s")


def _tokenizer_texts(exs: list, seed: int) -> list[str]:
    """Chat turns as plain text (role line + content), so role words and system prompts get merges.

    Special tokens stay out: the BPE trainer would otherwise spend merges on their pieces.
    """
    import random

    from dflashx.tiny.corpus import to_messages

    rng = random.Random(seed)
    return ["\n".join(f"{m['role']}\n{m.get('reasoning_content', '')}\n\n{m['content']}\n"
                      for m in to_messages(ex, rng)) for ex in exs]
