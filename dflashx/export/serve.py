"""The serving command lines for the exported drafter, and the export folders' README.

`Serving.of(config, facts, target, sglang_dir, vllm_dir)` gathers what the commands depend on
from the written DFlash config.json and the target's facts; `sglang_argv` / `vllm_argv` build
the argv, `shell` renders one as a copyable multi-line command, `readme` writes the README.

SGLang flags (sgl-project/sglang, `python/sglang/srt/arg_groups/fields/spec.py` and
`exec_.py`, `server_args.py`): `--speculative-algorithm DFLASH`,
`--speculative-draft-model-path`, `--speculative-num-draft-tokens` (DFLASH's block size),
`--speculative-draft-window-size` (the draft's context window; `--speculative-dflash-draft-window-size`
is its deprecated alias) and, for targets with Gated DeltaNet layers, `--mamba-radix-cache-strategy
extra_buffer` (renamed from `--mamba-scheduler-strategy`, sglang issue 27418; the old name is kept as
a deprecated alias). vLLM: `--speculative-config '{"method": "dflash", "model": ...,
"num_speculative_tokens": B - 1}'` as in the z-lab README. Both: the family's `--reasoning-parser` for a
target with a thinking or reasoning channel (`dflashx.targets.parsers`: qwen3; gpt-oss / openai_gptoss).

The target's parallel layout is the plan's (`stages.generate.serving.tp`): `--tp-size` (SGLang) /
`--tensor-parallel-size` (vLLM) when it spans several GPUs, and for a mixture-of-experts target
expert parallelism over the same GPUs, `--ep-size` (SGLang server arguments,
https://docs.sglang.io/cookbook/base/reference/server_arguments; expert parallelism,
https://docs.sglang.io/advanced_features/expert_parallelism.html) / `--enable-expert-parallel`
(vLLM, https://docs.vllm.ai/en/latest/serving/expert_parallel_deployment.html). The drafter itself
is dense whatever the target: it needs no MoE flag.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any, Mapping

from dflashx.config.drafter import HF_ARCHITECTURE
from dflashx.targets.parsers import reasoning_parser
from dflashx.targets.registry import TargetFacts

HYBRID_FLAG = ("--mamba-radix-cache-strategy", "extra_buffer")
OLD_FLAG_NAMES = {"--mamba-radix-cache-strategy": "--mamba-scheduler-strategy",
                  "--speculative-draft-window-size": "--speculative-dflash-draft-window-size"}


@dataclass(frozen=True)
class Serving:
    target: str
    sglang_dir: str
    vllm_dir: str
    block_size: int
    sliding_window: int | None  # the drafter's window, when one of its layers slides
    every_layer_slides: bool
    hybrid: bool  # the target has linear-attention (Gated DeltaNet) layers
    sglang_reasoning_parser: str | None
    vllm_reasoning_parser: str | None
    tp: int = 1  # GPUs the target spans (the plan's serving layout)
    moe: bool = False  # the target routes tokens to experts: expert parallelism over the tp GPUs
    dflash2: bool = False  # a DFlash2 drafter (architectures: DFlash2DraftModel)

    @property
    def vllm_model(self) -> str:
        """The folder vLLM loads: the speculators one for DFlash; for DFlash2 the DFlash-layout one, whose
        `dflash_config` vLLM's DFlash2DraftModel reads (PR #52816; no speculators DFlash2 type is known)."""
        return self.sglang_dir if self.dflash2 else self.vllm_dir

    @classmethod
    def of(cls, config: Mapping[str, Any], facts: TargetFacts, target: str, sglang_dir: str,
           vllm_dir: str, tp: int = 1) -> "Serving":
        types = list(config.get("layer_types") or [])
        slides = "sliding_attention" in types
        family = facts.model_type if facts.thinking else ""
        block = config.get("block_size") or config["dflash_config"]["block_size"]
        return cls(target=target, sglang_dir=sglang_dir, vllm_dir=vllm_dir, block_size=int(block),
                   sliding_window=config.get("sliding_window") if slides else None,
                   every_layer_slides=slides and all(t == "sliding_attention" for t in types),
                   hybrid="linear_attention" in facts.layer_types,
                   sglang_reasoning_parser=reasoning_parser(family, "sglang"),
                   vllm_reasoning_parser=reasoning_parser(family, "vllm"), tp=tp, moe=facts.is_moe,
                   dflash2=config.get("architectures") == [HF_ARCHITECTURE["dflash2"]])


def sglang_argv(s: Serving) -> list[str]:
    argv = ["python", "-m", "sglang.launch_server", "--model-path", s.target,
            "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", s.sglang_dir,
            "--speculative-num-draft-tokens", str(s.block_size)]
    if s.sliding_window is not None:
        argv += ["--speculative-draft-window-size", str(s.sliding_window)]
    if s.hybrid:
        argv += list(HYBRID_FLAG)
    if s.tp > 1:
        argv += ["--tp-size", str(s.tp)] + (["--ep-size", str(s.tp)] if s.moe else [])
    if s.sglang_reasoning_parser:
        argv += ["--reasoning-parser", s.sglang_reasoning_parser]
    return argv


def vllm_argv(s: Serving) -> list[str]:
    # DFlash2 too: vLLM picks DFlash2 from the checkpoint's architectures and sizes its convolution's
    # block as num_speculative_tokens + 1, so B - 1 it must stay (PR #52816, qwen3_dflash2.py)
    spec = {"method": "dflash", "model": s.vllm_model, "num_speculative_tokens": s.block_size - 1}
    argv = ["vllm", "serve", s.target, "--speculative-config", json.dumps(spec)]
    if s.tp > 1:
        argv += ["--tensor-parallel-size", str(s.tp)] + (["--enable-expert-parallel"] if s.moe else [])
    if s.vllm_reasoning_parser:
        argv += ["--reasoning-parser", s.vllm_reasoning_parser]
    return argv


def shell(argv: list[str]) -> str:
    """`argv` as a copyable command: the program, then one flag (with its value) per line."""
    head, rest = [], list(argv)
    while rest and not rest[0].startswith("--"):
        head.append(rest.pop(0))
    lines = [shlex.join(head)]
    while rest:
        flag = [rest.pop(0)]
        while rest and not rest[0].startswith("--"):
            flag.append(rest.pop(0))
        lines.append("    " + shlex.join(flag))
    return " \\\n".join(lines)


def commands(s: Serving) -> str:
    """Both serving commands, as the export prints them."""
    return f"# SGLang\n{shell(sglang_argv(s))}\n\n# vLLM\n{shell(vllm_argv(s))}\n"


def _notes(s: Serving) -> list[str]:
    notes = [f"`--speculative-num-draft-tokens {s.block_size}` is the block the drafter was trained with; vLLM "
             f"counts the drafted tokens after the anchor, `num_speculative_tokens` {s.block_size - 1}."]
    if s.sliding_window is not None:
        scope = ("every drafter layer slides, so this is exact" if s.every_layer_slides else
                 "a full-attention layer then also sees only this window: drop the flag to keep its whole context")
        notes.append(f"`--speculative-draft-window-size {s.sliding_window}`: the drafter's trained window ({scope}). "
                     "For vLLM, the z-lab README installs vLLM from PR 40898 to serve interleaved sliding-window "
                     "drafters.")
    if s.dflash2:
        notes.append("DFlash2 (`DFlash2DraftModel`: convolutions and a path selector on the DFlash backbone): SGLang "
                     "serves it from PR 35371 on (merged after v0.5.18), vLLM from PR 52816 on, which loads the "
                     f"DFlash-layout folder `{s.sglang_dir}` and sizes the convolution's block as "
                     "num_speculative_tokens + 1: keep it at the trained block - 1.")
    if s.hybrid:
        notes.append("The target has Gated DeltaNet (linear attention) layers: "
                     f"`{' '.join(HYBRID_FLAG)}` as in the z-lab README's hybrid SGLang example (the radix cache "
                     "keeps extra Mamba-state buffers, so overlap scheduling stays on; SGLang's `auto` falls back "
                     "to `no_buffer` and turns overlap off where it cannot).")
    if s.moe:
        notes.append("The target is a mixture of experts; the drafter is dense (it reads the target's hidden states, "
                     "not its experts)" + (f", and the experts are spread over the {s.tp} tensor-parallel GPUs "
                                          "(expert parallelism)." if s.tp > 1 else "."))
    used = [flag for flag in sglang_argv(s) if flag in OLD_FLAG_NAMES]
    if used:
        notes.append("SGLang builds from before these flags were renamed spell them "
                     + ", ".join(f"`{OLD_FLAG_NAMES[n]}` (for `{n}`)" for n in used) + ".")
    return notes


README = """# {name}: DFlash drafter

Block-diffusion drafter (DFlash, arXiv 2602.06036) for `{target}`, trained by dflashx.

| | |
|---|---|
| block size | {block_size} |
| drafter layers | {num_layers} ({layer_types}) |
| target layers tapped | {target_layer_ids} of {num_target_layers} (layer l = output of decoder layer l) |
| mask token id | {mask_token_id} |
| weights | model.safetensors, {dtype} |

Two folders, one set of weights: `{sglang_dir}` (DFlash / z-lab layout: SGLang, the z-lab `dflash`
package) and `{vllm_dir}` (speculators layout: vLLM). dflashx checked both against the engines'
config contracts when it wrote them (docs/export.md).

## Serve with SGLang

```bash
{sglang}
```

## Serve with vLLM

```bash
{vllm}
```

{notes}

The target's embedding and LM head are shared with the drafter at serve time; they are not in
these folders.

## Load in Python

```python
from dflash.model import DFlashDraftModel  # z-lab `dflash` package
draft = DFlashDraftModel.from_pretrained("{sglang_dir}", dtype="auto")
```
"""


def readme(s: Serving, config: Mapping[str, Any], name: str, dtype: str) -> str:
    dflash = config.get("dflash_config") or {}
    return README.format(
        name=name, target=s.target, block_size=s.block_size, num_layers=config.get("num_hidden_layers"),
        layer_types=", ".join(config.get("layer_types") or []), target_layer_ids=dflash.get("target_layer_ids"),
        num_target_layers=config.get("num_target_layers"), mask_token_id=dflash.get("mask_token_id"), dtype=dtype,
        sglang_dir=s.sglang_dir, vllm_dir=s.vllm_dir, sglang=shell(sglang_argv(s)), vllm=shell(vllm_argv(s)),
        notes="\n".join(f"- {n}" for n in _notes(s)),
    )
