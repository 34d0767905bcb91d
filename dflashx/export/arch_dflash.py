"""DFlash's export half (`dflashx.export.architecture`): the DFlash / z-lab layout with its causality rules, and the
speculators layout for vLLM when the layers' causality fits its one flag."""

from __future__ import annotations

from typing import Any, Mapping

from dflashx.config.architectures.spec import EngineSupport
from dflashx.export.contract import Violation
from dflashx.export.sglang import causality
from dflashx.export.speculators import causality_fits
from dflashx.targets.registry import TargetFacts

DISPLAY = "DFlash"
DESCRIBE = "Block-diffusion drafter (DFlash, arXiv 2602.06036)"
VLLM_READS_DFLASH_LAYOUT = False


def check(config: Mapping[str, Any], facts: TargetFacts,
          shapes: Mapping[str, tuple[int, ...]] | None) -> list[Violation]:
    return causality(config)


def speculators_form(config: Mapping[str, Any]) -> bool:
    return causality_fits(config)


def one_folder_why() -> str:
    return "a speculators config gives vLLM one causality for every layer, and this drafter's layers differ"


def rows(dflash_config: Mapping[str, Any]) -> list[tuple[str, Any]]:
    return []


def notes(block_size: int) -> list[str]:
    return []


def vllm_gpu(row: EngineSupport) -> str:
    return ""


def vllm_cpu() -> str | None:
    return None
