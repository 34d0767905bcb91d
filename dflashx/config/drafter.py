"""The drafter section of the recipe: the backbone's keys, the architecture (`dflashx.config.architectures`: DFlash,
DFlash2, any registered one) and that architecture's own keys.

The architectures' keys (`drafter.conv_kernel_size` ...) sit beside the backbone's; each registered architecture
validates its own and fills its defaults (`architectures.drafter_keys`), whichever architecture the recipe names, so
that a stage key and a calibration read the same keys for every recipe. They are the model's extra fields, read
typed through their architecture (`ArchitectureSpec.keys_of`); `dflashx schema` lists them
(`__get_pydantic_json_schema__`). Whether a key fits the target is the architecture's plan check.
"""

# No `from __future__ import annotations` here: pydantic would evaluate every field's string
# annotation when the class is created, which `dflashx plan`'s start-up pays (benchmarks/cli_latency.py).

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, GetJsonSchemaHandler, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic.fields import FieldInfo
from pydantic_core import CoreSchema

from dflashx.config import architectures
from dflashx.config.fields import OUTPUT, PATH, Strict

# The `architectures` entry of each built-in architecture's config.json, for readers outside dflashx (inside, ask
# `architectures.architecture(name).hf_name`).
HF_ARCHITECTURE: dict[str, str] = {name: architectures.architecture(name).hf_name for name in architectures.names()}


def _schema_keys() -> dict[str, Any]:
    """Each registered architecture's keys as JSON Schema properties, named by their architecture."""
    out: dict[str, Any] = {}
    for spec in architectures.REGISTRY.values():
        for name, prop in spec.keys.model_json_schema().get("properties", {}).items():
            out[name] = prop | {"description": f"(drafter.architecture: {spec.name}) {prop.get('description', '')}"}
    return out


class DrafterSpec(Strict):
    """The drafter: DFlash's block-diffusion backbone (arXiv 2602.06036) and its architecture (`dflash`, `dflash2` or
    another registered one, `dflashx.config.architectures`) with that architecture's own keys."""

    # an architecture's own keys are extra fields, each validated by its architecture (module doc)
    model_config = ConfigDict(extra="allow")

    architecture: Annotated[str, AfterValidator(architectures.known)] = Field(
        architectures.DEFAULT,
        description="The drafter architecture, one of the registered ones (`dflashx.config.architectures`): "
                    + "; ".join(f"`{s.name}`: {s.summary}" for s in architectures.REGISTRY.values()) + ".",
        json_schema_extra=OUTPUT,
    )
    num_layers: int = Field(5, ge=1, description="Transformer layers of the drafter.", json_schema_extra=OUTPUT)
    block_size: int = Field(16, ge=2, description="Anchor + (B-1) mask tokens (at least 2: one to draft).",
                            json_schema_extra=OUTPUT)
    num_target_layers: int = Field(5, ge=1, description="k target layers fused by `fc`.", json_schema_extra=OUTPUT)
    target_layer_ids: list[int] | None = Field(
        None, description="Explicit target layer ids; default spreads k over the target.", json_schema_extra=OUTPUT
    )
    mask_token_id: int | None = Field(None, description="Unused embedding row; default from the target.",
                                      json_schema_extra=OUTPUT)
    layer_types: list[Literal["full_attention", "sliding_attention"]] | None = Field(
        None, description="Attention type per drafter layer; default: all full attention.", json_schema_extra=OUTPUT
    )
    sliding_window: int | None = Field(
        None, ge=1, description="Window of `sliding_attention` layers, tokens.", json_schema_extra=OUTPUT
    )
    intermediate_size: int | None = Field(None, ge=1, description="Default: the target's FFN size.",
                                          json_schema_extra=OUTPUT)
    init_from: str | None = Field(None, description="Folder of a DFlash checkpoint to continue training.",
                                  json_schema_extra=PATH)
    precision: Literal["bf16", "fp8"] = Field(
        "bf16",
        description="Matmuls of the drafter's linear layers in training: `fp8` runs them in float8 with row-wise "
                    "scales (torchao float8 training; Hopper or Blackwell GPUs, the plan checks the profile); "
                    "weights, optimizer states and the exported drafter stay bf16.",
        json_schema_extra=OUTPUT,
    )

    @model_validator(mode="before")
    @classmethod
    def _architecture_keys(cls, data: Any) -> Any:
        return architectures.drafter_keys(data, cls)

    @classmethod
    def __get_pydantic_json_schema__(cls, core: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        schema = handler.resolve_ref_schema(handler(core))
        schema["properties"] = schema.get("properties", {}) | _schema_keys()
        schema["additionalProperties"] = False
        return schema

    @classmethod
    def extra_fields(cls) -> dict[str, FieldInfo]:
        """The architectures' keys this section holds, as fields (their markers: stage keys, calibration)."""
        return architectures.key_fields()
