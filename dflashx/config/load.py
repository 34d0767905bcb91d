"""Load a recipe file into a validated `Recipe`.

Order: the `extends` chain (base first, child keys win, lists replace) -> a `hardware=NAME`
override -> the hardware profile (by name, with its optional calibration file; `local`: this machine,
detected by the caller's `local` function, the only I/O-bound part, which config never runs itself) -> the other
dotted overrides -> secrets check -> `${...}` interpolation -> relative paths -> validation.
Every problem found on the way is collected and raised together as one `RecipeError`. Each file is
read by `yaml_read.read_mapping` (UTF-8, bounded alias expansion, duplicate keys) into plain dicts
and lists, composed with `tree` and interpolated with `interpolate`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import yaml
from pydantic import ValidationError

from dflashx.config import suggest
from dflashx.config.anchor import anchor_relative_paths
from dflashx.config.errors import (
    Loc,
    Origin,
    RecipeProblem,
    RecipeError,
    SourceMap,
    dotted,
    validation_problems,
)
from dflashx.config.interpolate import InterpolationError, MissingValue, Interpolator, needs_interpolation
from dflashx.config.schema import STAGE_ORDER, HardwareProfile, Recipe
from dflashx.config.tree import ABSENT, merge, select, update
from dflashx.config.yaml_read import load_value, read_mapping

PROFILES_ENV = "DFLASHX_PROFILES_DIR"  # user profile folders (os.pathsep-separated), searched first
# The built-in profiles: package data (dflashx/hardware_profiles/*.yaml, shipped in the wheel), so
# they are found the same way from a checkout, an editable install or `pip install dflashx`.
BUILTIN_PROFILES = Path(__file__).resolve().parents[1] / "hardware_profiles"
CALIBRATION_SUFFIX = ".calibration.yaml"
LOCAL_PROFILE = "local"  # `hardware: local`: this machine, detected (a file of that name is not read)
LocalDetector = Callable[[], HardwareProfile]  # `dflashx.run.local_hardware.local_profile`, handed in by the CLI
SECRETS_HINT = (
    "remove it: credentials come from the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
    "WANDB_API_KEY, HF_TOKEN) or an AWS profile (storage.s3.aws_profile), never from the recipe"
)


@dataclass(frozen=True)
class LoadedRecipe:
    """A validated recipe, the file it came from and the merged dict that was validated."""

    recipe: Recipe
    path: Path
    data: dict[str, Any]
    files: tuple[Path, ...] = ()  # every file that contributed: bases, the recipe, profile, calibration


@dataclass(frozen=True)
class Override:
    """One `KEY=VALUE` command-line override, with short forms expanded (`train.lr` -> `stages.train.lr`)."""

    loc: Loc
    value: Any
    text: str

    @property
    def key(self) -> str:
        return ".".join(str(p) for p in self.loc)

    @property
    def origin(self) -> Origin:
        return _override_origin(self.text)


def _override_origin(text: str) -> Origin:
    """`override 'KEY=VALUE'`, the value hidden when it looks like a credential."""
    key, _, raw = text.partition("=")
    hidden = suggest.looks_secret(key.split(".")[-1], raw) or suggest.SECRET_KEY.search(raw)
    return Origin(f"override '{key}=<hidden>'" if hidden else f"override '{text}'")


# --------------------------------------------------------------------------- hardware profiles


def profile_dirs(recipe_dir: Path | None = None) -> list[Path]:
    """Folders searched for `NAME.yaml`, first match wins (see docs/hardware.md): each folder of
    `$DFLASHX_PROFILES_DIR`, the recipe's `../hardware_profiles`, `./hardware_profiles`, then the
    built-in profiles inside the package. User folders come first, so a user's `NAME.yaml`
    shadows the built-in profile of that name. Duplicates (the same folder written two ways) are listed once."""
    dirs = [Path(p) for p in os.environ.get(PROFILES_ENV, "").split(os.pathsep) if p]
    if recipe_dir is not None:
        dirs.append(recipe_dir.parent / "hardware_profiles")
    dirs += [Path.cwd() / "hardware_profiles", BUILTIN_PROFILES]
    unique: dict[Path, None] = {}
    for d in dirs:
        unique.setdefault(d.resolve(), None)
    return list(unique)


def available_profiles(recipe_dir: Path | None = None) -> dict[str, Path]:
    """Profile name -> file over `profile_dirs` in order (the first folder holding a name wins);
    `NAME.calibration.yaml` files are not profiles and are skipped."""
    found: dict[str, Path] = {}
    for d in profile_dirs(recipe_dir):
        for f in sorted(d.glob("*.yaml")) if d.is_dir() else []:
            if not f.name.endswith(CALIBRATION_SUFFIX) and f.stem != LOCAL_PROFILE:
                found.setdefault(f.stem, f)
    return found


def load_profile(name: str, recipe_dir: Path | None = None, local: LocalDetector | None = None) -> HardwareProfile:
    """One hardware profile by name, calibration merged, validated on its own (`local`: `local()`'s)."""
    loader = _Loader(name, local)
    cfg = loader.profile(name, recipe_dir, where=Origin(f"profile '{name}'"), prefix=())
    data = loader.interpolate(cfg) if cfg is not None else {}
    loader.raise_if_any()
    try:
        return HardwareProfile.model_validate(data)
    except ValidationError as exc:
        loader.fail(validation_problems(exc, loader.sources, Origin(name), root=HardwareProfile))


# --------------------------------------------------------------------------- overrides


def parse_overrides(items: Sequence[str]) -> tuple[list[Override], list[RecipeProblem]]:
    """Parse `KEY=VALUE` strings; values are YAML (`1e-4`, `true`, `[1, 2]`, `{a: 1}`)."""
    out, problems = [], []
    for text in items:
        key, sep, raw = text.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            problems.append(RecipeProblem(
                "override must look like KEY=VALUE", _override_origin(text),
                fix="e.g. train.lr=1e-4, stages.generate.max_tokens=4096 or hardware=b200_nvl8",
            ))
            continue
        loc: Loc = tuple(int(p) if p.isdigit() else p for p in parts)
        if loc[0] in STAGE_ORDER:
            loc = ("stages",) + loc
        try:
            value = load_value(raw)
        except yaml.YAMLError as exc:
            problems.append(RecipeProblem(f"cannot parse the value: {exc}", _override_origin(text), dotted(loc)))
            continue
        out.append(Override(loc, value, text))
    return out, problems


# --------------------------------------------------------------------------- loading


def load_recipe(path: str | os.PathLike[str], overrides: Sequence[str] = (),
                local: LocalDetector | None = None) -> LoadedRecipe:
    """Compose, override, interpolate, anchor relative paths and validate one recipe file. `local` detects
    this machine's profile, called only when the recipe says `hardware: local`."""
    file = Path(os.path.abspath(path))
    loader = _Loader(file, local)
    cfg = loader.compose(file, stack=())
    parsed, problems = parse_overrides(overrides)
    loader.problems += problems
    for ov in parsed:
        if ov.loc == ("hardware",):
            loader.apply(cfg, ov)
    loader.select_hardware(cfg, file.parent)
    for ov in parsed:
        if ov.loc != ("hardware",):
            loader.apply(cfg, ov)
    skip = loader.check_secrets(cfg)
    data = loader.interpolate(cfg)
    anchor_relative_paths(data, loader.sources)
    skip += loader.uninterpolated
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:  # skipped keys already have their problem recorded
        loader.fail(loader.problems + validation_problems(exc, loader.sources, Origin(str(file)), skip=skip))
    loader.raise_if_any()
    return LoadedRecipe(recipe, file, data, tuple(loader.sources.files))


class _Loader:
    """State of one load: where each key came from and the problems found so far."""

    def __init__(self, top: Path | str, local: LocalDetector | None = None) -> None:
        self.top = top  # the recipe (or profile) being loaded, named in the error's title
        self.local = local
        self.sources = SourceMap()
        self.problems: list[RecipeProblem] = []
        self.uninterpolated: list[Loc] = []

    def fail(self, problems: list[RecipeProblem]) -> NoReturn:
        raise RecipeError(problems, self.top) from None

    def raise_if_any(self) -> None:
        if self.problems:
            self.fail(self.problems)

    def parse(self, file: Path) -> tuple[dict[str, Any], yaml.MappingNode]:
        """One YAML mapping file as plain data and its node tree (for line numbers)."""
        try:
            return read_mapping(file)
        except RecipeError as exc:
            self.fail(exc.problems)

    def read(self, file: Path, prefix: Loc = ()) -> dict[str, Any]:
        cfg, node = self.parse(file)
        self.sources.add_file(file, node, prefix)
        return cfg

    def compose(self, file: Path, stack: tuple[Path, ...]) -> dict[str, Any]:
        """The recipe merged over its `extends` chain (child keys win, lists replace)."""
        cfg, node = self.parse(file)
        base_cfg = None
        found = next(((k, v) for k, v in node.value if k.value == "extends"), None)
        if found is not None:
            key_node, value_node = found
            where = Origin(str(file), key_node.start_mark.line + 1)
            base_name = value_node.value
            if not isinstance(value_node, yaml.ScalarNode) or value_node.tag != "tag:yaml.org,2002:str":
                self.fail([RecipeProblem("`extends` must be a path to a base recipe", where, "extends",
                                         expected="a file name such as base.yaml")])
            base = Path(os.path.normpath(file.parent / base_name))
            chain = stack + (file,)
            if base.resolve() in {p.resolve() for p in chain}:
                cycle = " -> ".join(p.name for p in chain + (base,))
                self.fail([RecipeProblem(f"extends cycle: {cycle}", where, "extends",
                                         fix="remove `extends` from one of these files")])
            if not base.is_file():
                siblings = (f.name for f in base.parent.glob("*.yaml")) if base.parent.is_dir() else ()
                hint = suggest.did_you_mean(base.name, siblings) or f"`extends` is relative to {file.parent}"
                self.fail([RecipeProblem(f"base recipe not found: {base}", where, "extends", fix=hint)])
            base_cfg = self.compose(base, chain)
            cfg.pop("extends")
        self.sources.add_file(file, node)
        return merge(base_cfg, cfg) if base_cfg is not None else cfg

    def apply(self, cfg: dict[str, Any], ov: Override) -> None:
        """Merge one override into `cfg`; it may add keys but never turn a value into a section."""
        for n in range(1, len(ov.loc)):
            above = select(cfg, ov.loc[:n])
            if above is not ABSENT and above is not None and not isinstance(above, (dict, list)):
                self.problems.append(RecipeProblem(
                    f"cannot apply override: `{dotted(ov.loc[:n])}` is a value, not a section",
                    ov.origin, dotted(ov.loc), fix=f"set `{dotted(ov.loc[:n])}=...` itself"))
                return
        try:
            update(cfg, ov.loc, ov.value)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            self.problems.append(RecipeProblem(f"cannot apply override: {str(exc).splitlines()[0]}", ov.origin,
                                               dotted(ov.loc)))
            return
        self.sources.add_override(ov.loc, ov.origin)

    def select_hardware(self, cfg: dict[str, Any], recipe_dir: Path) -> None:
        """Replace `hardware: NAME` by the named profile (a mapping is an inline profile)."""
        if "hardware" not in cfg:
            return
        name = cfg["hardware"]
        try:
            name = Interpolator(cfg).value(name) if needs_interpolation(name) else name
        except InterpolationError as exc:
            return self._interpolation_problem(("hardware",), exc)
        if isinstance(name, str):
            where = self.sources.locate(("hardware",)) or Origin(str(recipe_dir))
            profile = self.profile(name, recipe_dir, where, prefix=("hardware",))
            if profile is not None:
                cfg["hardware"] = profile
            else:
                self.uninterpolated.append(("hardware",))

    def profile(self, name: str, recipe_dir: Path | None, where: Origin, prefix: Loc) -> dict[str, Any] | None:
        """The profile `name` (with `NAME.calibration.yaml` merged into `calibrated`), or None."""
        if name == LOCAL_PROFILE:
            return self.local_profile(where, prefix)
        known = available_profiles(recipe_dir)
        if name not in known:
            hint = suggest.did_you_mean(name, [*known, LOCAL_PROFILE]) or (
                f"known profiles: {', '.join(sorted(known))}, and {LOCAL_PROFILE} (this machine, detected)")
            dirs = ", ".join(str(d) for d in profile_dirs(recipe_dir))
            self.problems.append(RecipeProblem(f"unknown hardware profile '{name}' (searched {dirs})", where,
                                               "hardware", fix=hint))
            return None
        cfg = self.read(known[name], prefix)
        self.sources.add_section(prefix, known[name])
        cfg.setdefault("name", name)
        calibration = known[name].with_name(name + CALIBRATION_SUFFIX)
        if calibration.is_file():
            cal = self.read(calibration, prefix)
            extra = [k for k in cal if k != "calibrated"]
            if extra:
                loc = prefix + (extra[0],)
                self.problems.append(RecipeProblem(
                    "a calibration file may only hold `calibrated:`", self.sources.locate(loc), dotted(loc),
                    fix="written by `dflashx calibrate`; edit the profile itself instead"))
            else:
                cfg = merge(cfg, cal)
        return cfg

    def local_profile(self, where: Origin, prefix: Loc) -> dict[str, Any] | None:
        """`hardware: local`: the profile the caller's detection gives, or None (a problem) without one."""
        if self.local is None:
            self.problems.append(RecipeProblem(
                "`hardware: local` is the machine dflashx runs on, detected by the dflashx command that loads the "
                "recipe; this caller detects nothing", where, "hardware",
                fix="use `dflashx plan`, `dflashx run` or `dflashx validate`, or, from Python, pass "
                "local=dflashx.run.local_hardware.local_profile to load_recipe"))
            return None
        self.sources.add_section(prefix, Origin(f"hardware: {LOCAL_PROFILE} (detected on this machine)"))
        return self.local().model_dump(mode="json") | {"name": LOCAL_PROFILE}

    def check_secrets(self, cfg: dict[str, Any]) -> list[Loc]:
        """Report credential-looking keys/values (never echoing them); returns their keys."""
        found: list[Loc] = []

        def walk(value: Any, loc: Loc) -> None:
            items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
            for k, v in items:
                if suggest.looks_secret(str(k), v):
                    found.append(loc + (k,))
                else:
                    walk(v, loc + (k,))

        walk(cfg, ())
        for loc in found:
            self.problems.append(RecipeProblem("credentials do not belong in a recipe (value not shown)",
                                               self.sources.locate(loc), dotted(loc), fix=SECRETS_HINT))
        return found

    def interpolate(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """Plain containers with every `${...}` interpolated; failures become problems, keys skipped."""
        return self._interpolated(Interpolator(cfg), cfg, ())

    def _interpolated(self, interpolator: Interpolator, node: Any, loc: Loc) -> Any:
        if not isinstance(node, (dict, list)):
            return node
        out: dict[Any, Any] | list[Any] = {} if isinstance(node, dict) else []
        for k, value in node.items() if isinstance(node, dict) else enumerate(node):
            if needs_interpolation(value):
                try:
                    value = interpolator.value(value)
                except InterpolationError as exc:
                    self._interpolation_problem(loc + (k,), exc)
                    continue
            else:
                value = self._interpolated(interpolator, value, loc + (k,))
            if isinstance(out, dict):
                out[k] = value
            else:
                out.append(value)
        return out

    def _interpolation_problem(self, loc: Loc, exc: InterpolationError) -> None:
        self.uninterpolated.append(loc)
        hint: str | None
        if isinstance(exc, MissingValue):
            message, hint = "value is required (`???`)", "set it in the recipe or with an override"
        else:
            message = f"cannot interpolate: {exc}"
            hint = "set the variable or give a default: ${oc.env:NAME,default}" if exc.env else None
        self.problems.append(RecipeProblem(message, self.sources.locate(loc), dotted(loc), fix=hint or ""))
