"""Online capture of target features: only the tapped layers, and no layer after the last one.

Forward hooks sit on the selected decoder layers of a frozen HF causal LM (qwen3, qwen3_5 text
with Gated DeltaNet, qwen3_next: any model whose decoder stack is an `nn.ModuleList` named
`layers`). The hook on the deepest tapped layer raises a private exception that ends the forward,
so later layers, the final norm and the LM head never run, and `output_hidden_states` is never
asked for. Layer id l is the output of decoder layer l, i.e. HF `hidden_states[l + 1]` (for every
l but the last layer, whose `hidden_states` entry has the final norm applied).

Public API: `find_decoder_layers(model) -> nn.ModuleList`, `FeatureCapture(model, layer_ids)` with
`capture(input_ids, attention_mask=None) -> features [b, L, k*H]` (training: stops early),
`capture_with_final(...) -> (features, final hidden [b, L, H])` (training on the target's argmax), and
`with cap.recording(): out = target(...)` then `cap.features()` (speculative decoding: the full
verification forward with logits and KV cache, recording the tapped layers on the way).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import nn


class _StopForward(Exception):
    """Raised by the last hook to end the target's forward early."""


def find_decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder stack (the longest `ModuleList` whose name ends in `layers`)."""
    stacks = [m for name, m in model.named_modules()
              if isinstance(m, nn.ModuleList) and name.split(".")[-1] == "layers"]
    if not stacks:
        raise ValueError(f"{type(model).__name__} has no `layers` ModuleList to tap")
    return max(stacks, key=len)


def _base_model(model: nn.Module) -> nn.Module:
    """The decoder without the LM head when the model exposes one (`model.model`)."""
    get_decoder = getattr(model, "get_decoder", None)
    return get_decoder() if get_decoder is not None else model


class FeatureCapture:
    """Capture the outputs of `layer_ids` of a frozen target (eval mode, no grad)."""

    def __init__(self, model: nn.Module, layer_ids: list[int]):
        layers = find_decoder_layers(model)
        if not layer_ids or max(layer_ids) >= len(layers) or min(layer_ids) < 0:
            raise ValueError(f"target_layer_ids {layer_ids} outside the target's {len(layers)} layers")
        self.model = model.eval().requires_grad_(False)
        self.layer_ids = list(layer_ids)
        self._layers = layers
        self._store: dict[int, torch.Tensor] = {}

    def _hook(self, layer_id: int, last: bool):
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            self._store[layer_id] = output[0] if isinstance(output, tuple) else output
            if last:
                raise _StopForward

        return hook

    @contextmanager
    def recording(self, stop_early: bool = False) -> Iterator["FeatureCapture"]:
        """Hooks on while inside: any target forward records the tapped layers (read them with
        `features()`); with `stop_early` the deepest hook ends the forward (caught here)."""
        deepest = max(self.layer_ids)
        handles = [
            self._layers[i].register_forward_hook(self._hook(i, stop_early and i == deepest))
            for i in sorted(set(self.layer_ids))
        ]
        self._store.clear()
        try:
            yield self
        except _StopForward:
            pass
        finally:
            for h in handles:
                h.remove()

    def features(self) -> torch.Tensor:
        """The last recorded outputs of `layer_ids`, concatenated: [b, L, k*H]."""
        missing = [i for i in self.layer_ids if i not in self._store]
        if missing:
            raise RuntimeError(f"layers {missing} did not run; is the decoder stack found correctly?")
        return torch.cat([self._store[i] for i in self.layer_ids], dim=-1)

    @torch.no_grad()
    def capture(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Features [b, L, k*H] from a forward that stops after the deepest tapped layer."""
        with self.recording(stop_early=True):
            _base_model(self.model)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return self.features()

    @torch.no_grad()
    def capture_with_final(self, input_ids: torch.Tensor,
                           attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Features [b, L, k*H] and the final normed hidden states [b, L, H] (what the LM head reads)
        from one full forward of the decoder (`stages.train.labels: target`)."""
        with self.recording():
            out = _base_model(self.model)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return self.features(), out.last_hidden_state
