"""The reasoning parser each serving engine needs for a target family (pure data).

A thinking target's server splits the reasoning from the answer with a parser named per family
and engine:
- Qwen3 families (`<think>` ... `</think>`): `qwen3` in SGLang
  (https://docs.sglang.io/advanced_features/separate_reasoning.html) and in vLLM
  (`vllm/reasoning/qwen3_reasoning_parser.py`);
- gpt-oss (harmony's `analysis` channel): `gpt-oss` in SGLang (same page), `openai_gptoss` in vLLM
  (`vllm/reasoning/gptoss_reasoning_parser.py`, registered under that name; the vLLM gpt-oss recipe,
  https://github.com/vllm-project/recipes/blob/main/OpenAI/GPT-OSS.md).
Other families get none.

Public API: `reasoning_parser(model_type, engine) -> str | None`.
"""

from __future__ import annotations

from typing import Literal

Engine = Literal["sglang", "vllm"]
_GPT_OSS = {"sglang": "gpt-oss", "vllm": "openai_gptoss"}
_QWEN3 = {"sglang": "qwen3", "vllm": "qwen3"}


def reasoning_parser(model_type: str, engine: Engine) -> str | None:
    """The `--reasoning-parser` value of `engine` for a target of this transformers `model_type`."""
    if model_type == "gpt_oss":
        return _GPT_OSS[engine]
    if model_type.startswith("qwen3"):
        return _QWEN3[engine]
    return None
