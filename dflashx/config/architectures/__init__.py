"""The drafter-architecture registry: one `ArchitectureSpec` per architecture, and nothing else in dflashx asks
which architecture a drafter is (tests/test_architecture_questions.py checks it).

Adding an architecture is one module that builds its `ArchitectureSpec` (the pure half: keys, planner figures,
checks, names; see `dflash2.py`), the torch and export halves it names by module path, and one line below that
registers it (docs/design.md, "Adding a drafter architecture"). The torch and export halves are imported on
first use by `torch_half` / `export_half` (dflashx.dflash.architecture, dflashx.export.architecture): the only
function-level imports of the registry, so that config, resolve and plan stay free of torch.

The architecture's keys are the drafter section's (`drafter.conv_kernel_size` ...): `drafter_keys` validates
them, each architecture's with its own model, and fills every registered architecture's defaults, so that a
recipe's drafter section holds the same keys whichever architecture it names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from dflashx.config.architectures import dflash, dflash2
from dflashx.config.architectures.spec import ArchitectureSpec
from dflashx.config.suggest import did_you_mean

REGISTRY: dict[str, ArchitectureSpec] = {}
DEFAULT = "dflash"


def register(spec: ArchitectureSpec) -> ArchitectureSpec:
    """Make `spec` known by its name (a name or key another architecture has already is refused)."""
    if spec.name in REGISTRY:
        raise ValueError(f"drafter architecture {spec.name!r} is registered already")
    taken = {key for other in REGISTRY.values() for key in other.key_names()}
    if clash := taken & set(spec.key_names()):
        raise ValueError(f"drafter architecture {spec.name!r}: keys {sorted(clash)} belong to another architecture")
    REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    del REGISTRY[name]


def names() -> list[str]:
    return list(REGISTRY)


def architecture(name: str) -> ArchitectureSpec:
    """The registered architecture called `name`; a clear error with a did-you-mean otherwise."""
    spec = REGISTRY.get(name)
    if spec is None:
        hint = did_you_mean(name, REGISTRY) or "known: " + ", ".join(REGISTRY)
        raise ValueError(f"unknown drafter architecture {name!r}; {hint}")
    return spec


def by_hf_name(hf_names: Iterable[str]) -> ArchitectureSpec:
    """The one architecture whose config.json name is among `hf_names` (a checkpoint's `architectures`)."""
    given = list(hf_names)
    known = [spec for spec in REGISTRY.values() if spec.hf_name in given]
    if len(known) != 1:
        raise ValueError(f"architectures {given}: expected one of {sorted(s.hf_name for s in REGISTRY.values())}")
    return known[0]


def key_fields() -> dict[str, FieldInfo]:
    """Every registered architecture's own keys (their fields: description, default, markers)."""
    return {name: info for spec in REGISTRY.values() for name, info in spec.keys.model_fields.items()}


def known(name: str) -> str:
    """`name` when an architecture is registered under it (a field validator: the error names the key)."""
    return architecture(name).name


def drafter_keys(data: Any, model: type[BaseModel]) -> Any:
    """A drafter mapping with every registered architecture's keys validated by its own model, defaults filled
    (`model`'s own fields pass through; an unknown key is refused with a did-you-mean)."""
    if not isinstance(data, Mapping):
        return data
    out = dict(data)
    own = set(model.model_fields)
    ours = key_fields()
    for key in out:
        if key not in own and key not in ours:
            hint = did_you_mean(str(key), own | set(ours)) or "allowed keys: " + ", ".join([*own, *ours])
            raise ValueError(f"unknown drafter key {key!r}; {hint}")
    given_all, out = out, {key: value for key, value in out.items() if key not in ours}
    for spec in REGISTRY.values():  # in the registry's order, whatever the mapping's
        given = {key: given_all[key] for key in spec.key_names() if key in given_all}
        try:
            out |= spec.keys.model_validate(given).model_dump()
        except ValidationError as e:  # a validator raises ValueError: the key and what it expects, in its words
            raise ValueError("; ".join(f"drafter.{'.'.join(map(str, err['loc']))}: {err['msg']}"
                                       for err in e.errors())) from None
    return out


register(dflash.SPEC)
register(dflash2.SPEC)
