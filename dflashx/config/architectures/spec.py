"""What one drafter architecture is, for every layer that asks: `ArchitectureSpec`.

The pure half lives here (no torch): the recipe keys, the planner's figures of the architecture's own modules
(`ModuleFigures`, from the backbone's shapes and those keys), its plan checks, the published acceptance its
expected τ starts from, the names its checkpoints carry and the engines that serve it. The torch half (its
modules, extra loss terms and decoder proposal: `dflashx.dflash.architecture.TorchHalf`) and the export half
(layouts and their engine contracts: `dflashx.export.architecture.ExportHalf`) are modules named by path and
imported when first asked for (`dflashx.config.architectures.torch_half` / `export_half`), so the planner never
pays for torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pydantic import BaseModel


@dataclass(frozen=True)
class PublishedAcceptance:
    """A published acceptance measurement and where it comes from."""

    figures: tuple[float, ...]
    source: str
    figure: str
    conditions: str


@dataclass(frozen=True)
class Shapes:
    """The backbone's shapes an architecture's own modules are sized by (`resolve.flops.DrafterDims`)."""

    num_layers: int
    hidden_size: int
    vocab_size: int
    block_size: int = 16


@dataclass(frozen=True)
class ModuleFigures:
    """What an architecture's own modules add to the DFlash backbone, as the planner counts them (DFlash: nothing).
    Parameters split as the trainer groups them: `matrices`, weight matrices a supervised slot's gradient reaches
    whole (Muon steps them), and `vectors`, the rest (AdamW under Muon: base kernels, embedding tables);
    `table_params` of them are tables read by rows when serving (not read whole per forward)."""

    architecture: str
    matrices: int = 0
    vectors: int = 0
    table_params: int = 0
    layer_flops_per_token: float = 0.0  # forward, per drafter layer and block token
    slot_flops: float = 0.0  # training forward, per supervised slot
    serving_slot_flops: float = 0.0  # as served, per drafted position
    activation_per_token_layer: float = 0.0  # activation elements kept for backward, per block token and layer
    activation_per_slot: float = 0.0  # activation elements kept for backward, per supervised slot
    table_row_elements_per_slot: float = 0.0  # table elements a drafted position reads when serving
    calls_per_slot: int = 0  # launch-bound layer calls per drafted position beyond the block forward
    param_inputs: Mapping[str, Any] = field(default_factory=dict)  # the `--explain` inputs of the parameters
    flop_inputs: Mapping[str, Any] = field(default_factory=dict)  # ... and of the FLOPs

    @property
    def params(self) -> int:
        return self.matrices + self.vectors


class Issue(NamedTuple):
    """A plan finding an architecture raises about its own keys (`plan.rules_drafter` makes it a Finding)."""

    severity: str  # "error" | "warning"
    code: str
    key: str
    message: str
    fix: str


@dataclass(frozen=True)
class EngineSupport:
    """One engine's support for an architecture: the first release that serves it, the release dflashx's rules and
    commands were read against (`export.engines`), and what else it needs."""

    engine: str  # sglang | vllm
    architecture: str
    minimum: str | None  # None: served since the engine's first support for DFlash
    checked: str
    source: str
    requires: str = ""
    env: Mapping[str, str] = field(default_factory=dict)  # what the engine's server needs in its environment
    gpu_only: str = ""  # why the engine cannot serve it without a GPU ("" when it can)

    @property
    def name(self) -> str:
        return {"sglang": "SGLang", "vllm": "vLLM"}[self.engine]


Figures = Callable[[Shapes, Any], ModuleFigures]
Checks = Callable[[Any, Shapes, str], Iterable[Issue]]


def no_checks(keys: Any, shapes: Shapes, precision: str) -> Iterable[Issue]:
    return ()


@dataclass(frozen=True)
class ArchitectureSpec:
    """Everything the rest of dflashx asks about one drafter architecture (module doc)."""

    name: str  # drafter.architecture
    hf_name: str  # config.json `architectures` entry: what the reference, SGLang and vLLM dispatch on
    summary: str  # one line: what it is (the schema's description)
    keys: type[BaseModel]  # its own recipe keys, defaults and markers (a DFlash drafter has none)
    figures: Figures  # its modules' planner figures from the backbone's shapes and its keys
    published: PublishedAcceptance  # the acceptance its expected τ starts from
    published_block: int  # the block size that figure was measured at
    torch: str  # module path of its torch half (`dflashx.dflash.architecture.TorchHalf`)
    export: str  # module path of its export half (`dflashx.export.architecture.ExportHalf`)
    engines: tuple[EngineSupport, ...] = ()
    checks: Checks = no_checks
    causal_sliding: bool = True  # sliding layers causal as served (DFlash); False: every layer bidirectional
    keys_in_config: bool = False  # its keys (and block_size) written in config.json's dflash_config
    draft_calls: int = 3  # a draft forward's layer calls beyond its layers: embedding + norm, LM head, context

    def engine(self, engine: str) -> EngineSupport:
        """This architecture's support row for `engine` (sglang | vllm)."""
        return next(e for e in self.engines if e.engine == engine)

    def key_names(self) -> tuple[str, ...]:
        return tuple(self.keys.model_fields)

    def keys_of(self, drafter: Any) -> Any:
        """This architecture's keys, typed, read off a drafter description (recipe, resolved or checkpoint config)."""
        return self.keys.model_validate({name: getattr(drafter, name) for name in self.key_names()})

    def module_figures(self, shapes: Shapes, drafter: Any) -> ModuleFigures:
        return self.figures(shapes, self.keys_of(drafter))
