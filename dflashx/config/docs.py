"""Render docs/recipes.md: the guide to recipe files plus a key table generated from the schema.

    python -m dflashx.config.docs > docs/recipes.md

A test checks that the committed file equals `render()`, so the reference never drifts from
`dflashx/config/schema.py`.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from dflashx.config.fields import fields_of
from dflashx.config.schema import Recipe

GUIDE = """\
# Recipes

A recipe is one YAML file that describes a whole drafter project: the prompts, the target model,
the DFlash drafter, the hardware, every stage's parameters, tracking, storage and budget. It is
validated strictly before anything runs: an unknown or misspelled key is an error, never a setting
that is silently ignored.

```bash
dflashx validate recipes/qwen36_27b.yaml                 # schema + planner rules
dflashx validate recipes/qwen36_27b.yaml hardware=b200_nvl8 train.lr=1e-4
dflashx schema --out recipe.schema.json                   # JSON Schema for editors
dflashx profiles                                           # the hardware profiles
```

`dflashx validate` exits 0 when the recipe is fine, 1 when the planner finds an error (e.g. the
model does not fit the GPUs) and 2 when the recipe cannot be read or validated.

## How a recipe is put together

Loading happens in this order; each step sees the result of the one before:

1. **`extends`**: the base recipe (a path relative to the file that names it) is loaded first,
   then the file's own keys are merged over it. Chains (`a extends b extends c`) work; a cycle is an
   error. Mappings merge key by key; a list in the child replaces the base's list as a whole (to
   change one source, repeat the list).
2. **`hardware=NAME`** given on the command line replaces the recipe's `hardware`.
3. **Hardware profile**: `hardware: NAME` is replaced by the profile file `NAME.yaml`; `hardware: local`
   by the profile of the machine the command runs on, detected (docs/hardware.md). A mapping
   (`hardware: {name: ..., gpu: {...}}`) is an inline profile and used as it is. A GPU the GPU table
   knows (`gpu: {name: H200}`) takes the figures the profile leaves out from it.
4. **Other overrides** (`stages.train.lr=1e-4`, `hardware.usd_per_gpu_hour=2.1`) are merged on top, so
   they can change single numbers of a named profile.
5. **Secrets check**, then **`${...}` interpolation**, then **relative paths**, then
   **validation** against the schema below.

### Hardware profiles

`hardware: NAME` looks for `NAME.yaml` in these folders, first match wins:

1. every folder in `$DFLASHX_PROFILES_DIR` (separated by `:`),
2. `hardware_profiles/` next to the recipe's folder (`recipes/../hardware_profiles`),
3. `./hardware_profiles` in the working directory,
4. the built-in profiles shipped inside the package (`dflashx/hardware_profiles/`).

`local` is not a file: it is this machine, read with nvidia-smi (or torch) and matched to the GPU table;
what cannot be read or looked up is listed in its `unknown` and the plan says what each changes
(`dflashx profiles --show local` prints it).

If `NAME.calibration.yaml` sits next to the profile it is merged into the profile's `calibrated`
factors. `dflashx calibrate` writes that file; it holds only `calibrated: {factor: value}`.
A profile name that is not found gets a "did you mean" (or, when nothing is close, the list of
known names) and the folders that were searched.

### Overrides

Every command that takes a recipe also takes `KEY=VALUE` overrides after it. Values are YAML:
`1e-4`, `true`, `null`, `[0, 8, 16]`, `{a: 1}`. Short forms: a first key that is a stage name
means `stages.<name>`, so `train.lr=1e-4` is `stages.train.lr=1e-4`. List items are addressed by
index: `dataset.sources.0.cap=1000`. An override of an unknown key is reported like a misspelled key
in the file, with the override named as its origin.

### Interpolation

`${...}` is interpolated after composition and overrides, in OmegaConf's syntax (two of its forms):
`${target.model}` refers to another key of the final recipe (`${dataset.sources.0.name}` or
`[0]` for a list item; a value that is only `${...}` keeps the referenced value's type),
`${oc.env:NAME}` reads an environment variable (an error when it is unset) and
`${oc.env:NAME,default}` falls back to `default` (`null` for none). `???` marks a value that must
be set, by an override for instance; `\\${` is a literal `${`. Other resolvers are an error that
names these forms.

### Paths

Relative paths are anchored when the recipe is loaded to the folder of the file that wrote
the key (a base recipe's paths are relative to the base recipe; an override's to the working
directory):

- `dataset.sources[].path`, `drafter.init_from`, `stages.eval.prompts`, `stages.eval.suites[].path`:
  always paths.
- `target.model`, `target.tokenizer`, `stages.eval.baselines[].path`: paths when they start with
  `/`, `./`, `../` or `~`, or name an existing folder; otherwise Hugging Face ids such as
  `Qwen/Qwen3.6-27B`.
- `builtin:...` values and URLs are left as they are.
- `storage.root` is anchored to the working directory.

### Secrets

Credentials never go in a recipe. A key that looks like one (`aws_secret_access_key`,
`aws_access_key_id`, `password`, `api_key`, `token`, ...) or a value shaped like an AWS access
key id is an error, and the message never shows the value. S3 credentials come from the
environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`), an AWS profile named in
`storage.s3.aws_profile`, or the machine's role; W&B reads `WANDB_API_KEY`; the Hub reads `HF_TOKEN`.

### Errors

Every problem found is reported at once, each with the file and line that wrote the key (or the
override), the dotted key, what was expected and a hint:

```text
recipe recipes/my.yaml is invalid (2 problems):
recipes/my.yaml:31: stages.train.lrr: unknown key
    hint: did you mean 'lr'?
recipes/my.yaml:9: hardware: unknown hardware profile 'b200_nvl' (searched ...)
    hint: did you mean 'b200_nvl8'?
```

YAML syntax errors give the line and column; duplicate keys, missing files, `extends` cycles,
interpolations that fail and malformed overrides are reported the same way.

## Key reference

Generated from `dflashx/config/schema.py` by `python -m dflashx.config.docs`. "required" keys have
no default. `hardware` may be a profile name or a mapping with the keys of `hardware` below.
"""


def _strip(tp: Any) -> Any:
    return get_args(tp)[0] if get_origin(tp) is Annotated else tp


def type_name(tp: Any) -> str:
    """A short, readable name for a field's type."""
    tp = _strip(tp)
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return " \\| ".join(type_name(a) for a in get_args(tp))
    if origin is Literal:
        return " \\| ".join(f"`{v}`" for v in get_args(tp))
    if origin is list:
        item = type_name(get_args(tp)[0])
        return "list of sections" if item == "section" else f"list of {item}"
    if origin is dict:
        key, value = get_args(tp)
        return f"map {type_name(key)} → {type_name(value)}"
    if tp is type(None):
        return "null"
    if tp is Any:
        return "any"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "section"
    return getattr(tp, "__name__", str(tp))


_BOUNDS = ((at.Gt, "gt", ">"), (at.Ge, "ge", "≥"), (at.Lt, "lt", "<"), (at.Le, "le", "≤"))


def constraints(field: FieldInfo) -> str:
    """Bounds, lengths and patterns of a field, also those inside Optional[Annotated[...]]."""
    meta = list(field.metadata)
    for arg in get_args(field.annotation):
        if get_origin(arg) is Annotated:
            for extra in get_args(arg)[1:]:
                meta += extra.metadata if isinstance(extra, FieldInfo) else [extra]
    out = []
    for m in meta:
        for cls, attr, sign in _BOUNDS:
            if isinstance(m, cls):
                out.append(f"{sign} {getattr(m, attr)}")
        if isinstance(m, at.MinLen):
            out.append(f"at least {m.min_length} item(s)")
        if getattr(m, "pattern", None):
            out.append(f"matches `{m.pattern}`")
        if getattr(m, "func", None) is not None and "size" in getattr(m.func, "__name__", ""):
            out.append("bytes or a size such as `20TB`, `512GiB`")
    return ", ".join(out)


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        value = field.get_default(call_default_factory=True)
        return "(section)" if isinstance(value, BaseModel) else f"`{value!r}`"
    value = field.default
    if value is None or isinstance(value, bool):
        return f"`{str(value).lower() if value is not None else 'null'}`"
    return f"`{value!r}`" if value == "" else f"`{value}`"


def _model_of(tp: Any) -> tuple[type[BaseModel] | None, str]:
    """The section model behind a field (through Optional/list) and the key suffix (`[]` for lists)."""
    tp = _strip(tp)
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        tp = _strip(args[0]) if len(args) == 1 else tp
    suffix = ""
    if get_origin(tp) is list:
        tp, suffix = _strip(get_args(tp)[0]), "[]"
    return (tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None), suffix


def sections(model: type[BaseModel] = Recipe, prefix: str = "") -> Iterator[tuple[str, type[BaseModel]]]:
    """(dotted prefix, model) for the recipe and every nested section, depth first."""
    yield prefix, model
    for name, field in model.model_fields.items():
        sub, suffix = _model_of(field.annotation)
        if sub is not None:
            yield from sections(sub, f"{prefix}.{name}{suffix}" if prefix else f"{name}{suffix}")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def table(prefix: str, model: type[BaseModel]) -> str:
    """One Markdown table: key, type, default, constraints, description."""
    title = f"`{prefix}`" if prefix else "top level"
    doc = " ".join((model.__doc__ or "").split()) if model.__doc__ and model is not Recipe else ""
    lines = [f"### {title}", "", *([doc, ""] if doc else []),
             "| key | type | default | constraints | description |", "|---|---|---|---|---|"]
    for name, field in fields_of(model).items():  # the drafter's architecture keys too
        key = f"{prefix}.{name}" if prefix else name
        kind = "profile name \\| section" if key == "hardware" else type_name(field.annotation)
        lines.append(f"| `{key}` | {kind} | {default_text(field)} | "
                     f"{constraints(field)} | {_cell(field.description or '')} |")
    return "\n".join(lines) + "\n"


def render() -> str:
    """The whole of docs/recipes.md."""
    return GUIDE + "\n" + "\n".join(table(prefix, model) for prefix, model in sections())


if __name__ == "__main__":
    print(render(), end="")
