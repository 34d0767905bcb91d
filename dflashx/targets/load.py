"""The one loader of a recipe's target model and its tokenizer, for every stage.

- `load_tokenizer(target, **kwargs)`: the tokenizer `target.tokenizer` names when set, else the
  model's (`locate.locate_tokenizer`); what generation, QC, tokenization, training, evaluation and
  the chat-contract and context checks all render and encode with;
- `load_model(target, precision)`: the model `target.model` names, in the resolved load precision
  (`ResolvedTarget.load_precision`; `fp8` loads bf16 weights, each stage converts the layers it
  runs), on the CPU, in eval mode;
- `tokenizer_from(path)` / `model_from(path, precision)`: the same from an already located folder
  or hub id (a launched training process is handed the folder; the transformers backend its paths).

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


def model_from(path: str | Path, precision: str) -> Any:
    """`AutoModelForCausalLM` from a located folder or hub id, in `precision`'s torch dtype, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, TORCH_DTYPE[precision])
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()


def load_tokenizer(target: TargetSpec, **kwargs: Any) -> Any:
    """The recipe's tokenizer: `target.tokenizer` when set, else the model's."""
    return tokenizer_from(locate_tokenizer(target), **kwargs)


def load_model(target: TargetSpec, precision: str) -> Any:
    """The recipe's target model in `precision` (the resolved `target.load_precision`), on the CPU."""
    return model_from(locate_target(target), precision)
