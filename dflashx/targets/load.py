"""The one loader of a recipe's target model and its tokenizer, for every stage.

- `load_tokenizer(target, **kwargs)`: the tokenizer `target.tokenizer` names when set, else the
  model's (`locate.locate_tokenizer`); what generation, QC, tokenization, training, evaluation and
  the chat-contract and context checks all render and encode with;
- `load_model(target, precision)`: the model `target.model` names, in the resolved load precision
  (`ResolvedTarget.load_precision`; `fp8` loads bf16 weights, each stage converts the layers it
  runs), on the CPU, in eval mode;
- `tokenizer_from(path)` / `model_from(path, precision)`: the same from an already located folder
  or hub id (a launched training process is handed the folder; the transformers backend its paths);
- `stop_ids(target, tokenizer)`: the ids that end a completion, for every decoding (eval, the τ
  probe's held-out slice, the round-trip gate): the tokenizer's end-of-sequence id, the target's
  generation config's (`generation_config.json`, else what transformers derives from `config.json`
  when it loads the model, so a process that never loads the model reads the same) and `<|im_end|>`
  when the tokenizer knows it.

An MoE model runs its experts with transformers' `grouped_mm` (`EXPERTS_IMPLEMENTATION`), set explicitly:
the fastest measured for the trainer's target forward (benchmarks/results/moe_layer.json `forward`, a
Qwen3-30B-A3B-shaped 8-layer stack at 3,072 tokens on one H200: grouped_mm 22.8 ms, eager 337 ms,
batched_mm out of memory asking for 144 GiB); what the planner times (`plan/estimates/moe.py`).

torch and transformers are imported when something is loaded, so importing this module is cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflashx.config.fields import TORCH_DTYPE
from dflashx.targets.locate import locate_target, locate_tokenizer

if TYPE_CHECKING:
    from dflashx.config.schema import TargetSpec


def tokenizer_from(path: str | Path, **kwargs: Any) -> Any:
    """`AutoTokenizer` from a located folder or hub id (`kwargs`, e.g. `padding_side`, passed on)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), **kwargs)


EXPERTS_IMPLEMENTATION = "grouped_mm"


def fastest_experts(model: Any) -> Any:
    """Set an MoE model's experts to `EXPERTS_IMPLEMENTATION` (module doc); a dense model is left as it is."""
    if model._can_set_experts_implementation():
        model.set_experts_implementation(EXPERTS_IMPLEMENTATION)
    return model


def model_from(path: str | Path, precision: str) -> Any:
    """`AutoModelForCausalLM` from a located folder or hub id, in `precision`'s torch dtype, eval mode, MoE
    experts on `grouped_mm`."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, TORCH_DTYPE[precision])
    return fastest_experts(AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval())


def load_tokenizer(target: TargetSpec, **kwargs: Any) -> Any:
    """The recipe's tokenizer: `target.tokenizer` when set, else the model's."""
    return tokenizer_from(locate_tokenizer(target), **kwargs)


def load_model(target: TargetSpec, precision: str) -> Any:
    """The recipe's target model in `precision` (the resolved `target.load_precision`), on the CPU."""
    return model_from(locate_target(target), precision)


def stop_ids(target: TargetSpec, tokenizer: Any) -> list[int]:
    """The ids that end a completion of the recipe's target (module doc), sorted."""
    from transformers import AutoConfig, GenerationConfig

    folder = str(locate_target(target))
    try:
        generation = GenerationConfig.from_pretrained(folder)
    except OSError:  # no generation_config.json: what transformers derives from config.json on load
        generation = GenerationConfig.from_model_config(AutoConfig.from_pretrained(folder))
    ids = {tokenizer.eos_token_id}
    eos = generation.eos_token_id
    ids.update(eos if isinstance(eos, list) else [eos])
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    return sorted(i for i in ids if isinstance(i, int))
