"""DFlash (arXiv 2602.06036), the block-diffusion drafter: the backbone every architecture shares, with no modules
and no keys of its own. Its torch half is `dflashx.dflash.arch_dflash`, its export half `dflashx.export.arch_dflash`
(the DFlash / z-lab layout, and the speculators layout for vLLM)."""

from __future__ import annotations

from dflashx.config.architectures.spec import (ArchitectureSpec, EngineSupport, ModuleFigures, PublishedAcceptance,
                                               Shapes)
from dflashx.config.fields import Strict

NAME = "dflash"
PUBLISHED = PublishedAcceptance(
    (6.36,), "github.com/sgl-project/sglang/pull/16818 (Add DFLASH speculative decoding support)",
    "average accept length (tokens per verify step) 6.36 at TP 1, concurrency 1",
    "Qwen/Qwen3-8B + z-lab/Qwen3-8B-DFlash-b16 (block 16), GSM8K, greedy, SGLang")
PUBLISHED_BLOCK = 16


class DFlashKeys(Strict):
    """DFlash has no keys beyond the backbone's."""


NO_MODULES = ModuleFigures(NAME)


def figures(shapes: Shapes, keys: DFlashKeys) -> ModuleFigures:
    """No modules of its own."""
    return NO_MODULES


# The minimum releases are not established here; the commands were checked against SGLang 0.5.23's argument parser
# (the `sglang` extra, tests/test_sglang_commands.py) and vLLM 0.32.0's source.
ENGINES = (
    EngineSupport("sglang", NAME, None, "0.5.23",
                  "not established here; DFLASH landed with sgl-project/sglang PR #22077 (merged 2026-04-07)"),
    EngineSupport("vllm", NAME, None, "0.32.0",
                  "not established here; the speculators DFlash layout is parsed since vllm-project/vllm PR #38300 "
                  "(merged 2026-04-15)"),
)

SPEC = ArchitectureSpec(
    name=NAME, hf_name="DFlashDraftModel", summary="the DFlash drafter", keys=DFlashKeys, figures=figures,
    published=PUBLISHED, published_block=PUBLISHED_BLOCK, torch="dflashx.dflash.arch_dflash",
    export="dflashx.export.arch_dflash", engines=ENGINES)
