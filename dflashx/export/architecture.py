"""The export half of a drafter architecture (`ArchitectureSpec.export` names the module): its part of the DFlash
layout's engine contract, whether it has a speculators form, and what the README and the serve commands say of it.
A module that defines these is one (`arch_dflash.py`, `dflash2.py`):

- `DISPLAY` (the README's name for it) and `DESCRIBE` (its one-line description); `VLLM_READS_DFLASH_LAYOUT`:
  vLLM serves it from the DFlash layout (DFlash2), never from a speculators folder;
- `check(config, facts, shapes) -> [Violation]`: its rules on the DFlash-layout config.json and weights beyond
  the ones every architecture shares (`sglang.check_sglang`; DFlash: causality as the engines read it; DFlash2:
  its keys, causality, neutral keys, sizes, weights);
- `speculators_form(config) -> bool`: whether the export also writes the speculators layout for vLLM (DFlash,
  when its layers' causality fits one flag; DFlash2: never, vLLM reads the DFlash layout);
- `one_folder_why() -> str`: why a single folder serves every engine, when it does;
- `rows(dflash_config) -> [(name, value)]`: its own rows of the README's table;
- `notes(block_size) -> [str]`: its serving notes; `vllm_gpu(row) -> str`: what the README says before the vLLM
  command (its `EngineSupport` row); `vllm_cpu() -> str | None`: why vLLM's CPU build cannot serve it (None:
  it can, the README gives that command).

`export_half(name)` imports it on first use (the registry's one function-level import on the export side).
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping, Protocol, cast

from dflashx.config.architectures import REGISTRY, architecture
from dflashx.config.architectures.spec import ArchitectureSpec, EngineSupport
from dflashx.export.contract import Violation
from dflashx.targets.registry import TargetFacts


class ExportHalf(Protocol):
    """See the module doc."""

    DISPLAY: str
    DESCRIBE: str
    VLLM_READS_DFLASH_LAYOUT: bool

    def check(self, config: Mapping[str, Any], facts: TargetFacts,
              shapes: Mapping[str, tuple[int, ...]] | None) -> list[Violation]: ...

    def speculators_form(self, config: Mapping[str, Any]) -> bool: ...

    def one_folder_why(self) -> str: ...

    def rows(self, dflash_config: Mapping[str, Any]) -> list[tuple[str, Any]]: ...

    def notes(self, block_size: int) -> list[str]: ...

    def vllm_gpu(self, row: EngineSupport) -> str: ...

    def vllm_cpu(self) -> str | None: ...


def named_by(config: Mapping[str, Any]) -> ArchitectureSpec | None:
    """The registered architecture a config.json's `architectures` names exactly (None: none does)."""
    names = config.get("architectures")
    return next((spec for spec in REGISTRY.values() if names == [spec.hf_name]), None)


def export_half(name: str) -> ExportHalf:
    """The export half of the architecture called `name` (imported on first use)."""
    return cast(ExportHalf, importlib.import_module(architecture(name).export))
