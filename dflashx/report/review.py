"""`dflashx review BASE HEAD`: a markdown review of a recipe change for a pull request.

BASE and HEAD are recipe files, or `path@gitref` (the file as it is at that commit). For a git
ref, the recipe's folder and `hardware_profiles/` at that ref are extracted (`git archive`) into a
temporary folder so `extends:` chains and profile names point where they did at that commit. Each
side is loaded with `load_recipe` and planned with `make_plan`; the review shows the changed keys
of the validated recipes (defaults included), the plan totals and per-stage estimates that
changed, and the findings that appear or disappear. A BASE that does not exist (a new recipe) is
reviewed against nothing.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflashx.config.errors import RecipeError
from dflashx.config.load import load_recipe
from dflashx.run.local_hardware import local_profile
from dflashx.config.schema import Recipe
from dflashx.config.tree import flatten
from dflashx.plan.context import Estimates
from dflashx.plan.findings import Finding
from dflashx.plan.plan import Plan, make_plan
from dflashx.report.fmt import Section, band_text, human_bytes, human_seconds, human_value

FactsFor = Callable[[Recipe], Any]

# (label, `Estimates` field, formatter)
MEASURES: list[tuple[str, str, Callable[[float | None], str]]] = [
    ("time", "seconds", human_seconds),
    ("GPU-hours", "gpu_hours", lambda v: "-" if v is None else f"{v:,.1f}"),
    ("USD", "usd", lambda v: "-" if v is None else f"{v:,.0f}"),
    ("storage", "storage_bytes", human_bytes),
    ("peak GPU memory", "peak_gpu_memory_bytes", human_bytes),
]


@dataclass
class Side:
    spec: str
    data: dict[str, Any] | None = None  # validated recipe, flattened
    plan: Plan | None = None
    error: str | None = None  # why it could not be loaded
    missing: bool = False  # the file does not exist (a new recipe)


PROFILE_FOLDERS = ("dflashx/hardware_profiles", "hardware_profiles")  # this layout, then the older one


class RefError(ValueError):
    """A `path@gitref` whose ref cannot be resolved (no such commit, or no git repository):
    a usage error (exit 2), unlike a path missing at a valid ref, which is a new recipe."""


def split_spec(spec: str) -> tuple[Path, str | None]:
    """`recipes/a.yaml@main` -> (recipes/a.yaml, "main"); a plain existing path has no ref."""
    path, sep, ref = spec.rpartition("@")
    if not sep or not ref or Path(spec).exists():
        return Path(spec), None
    return Path(path), ref


def _git(args: list[str], cwd: Path) -> bytes:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=False)
    if out.returncode != 0:
        raise ValueError(f"git {' '.join(args)}: {out.stderr.decode().strip()}")
    return out.stdout


def _git_ok(args: list[str], cwd: Path) -> bool:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=False).returncode == 0


def materialize(path: Path, ref: str, workdir: Path) -> Path | None:
    """Extract `path`'s folder and the hardware profiles at `ref` under `workdir`; the recipe's new
    path, or None when the file does not exist at that ref."""
    path = path.resolve()
    folder = next((p for p in (path.parent, *path.parents) if p.is_dir()), Path.cwd())
    try:
        top = Path(_git(["rev-parse", "--show-toplevel"], folder).decode().strip())
    except ValueError as exc:
        raise RefError(f"cannot resolve {ref!r}: {path} is not in a git repository ({exc})") from None
    rel = path.relative_to(top)
    if not _git_ok(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], top):
        raise RefError(f"{ref!r} is not a commit of the git repository {top}")
    if not _git_ok(["cat-file", "-e", f"{ref}:{rel.as_posix()}"], top):
        return None
    archive = _git(["archive", "--format=tar", ref, "--", rel.parent.as_posix() or "."], top)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(workdir, filter="data")
    # the ref's profiles go where the recipe's loader looks first (its ../hardware_profiles): the
    # built-in folder of the package, or a top-level folder of an older layout
    for profiles in PROFILE_FOLDERS:
        if _git_ok(["cat-file", "-e", f"{ref}:{profiles}"], top):
            _extract_as(top, ref, profiles, workdir / rel.parent.parent / "hardware_profiles")
            break
    return workdir / rel


def _extract_as(top: Path, ref: str, folder: str, dest: Path) -> None:
    """The files of `folder` at `ref`, written into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    names = _git(["ls-tree", "--name-only", f"{ref}:{folder}"], top).decode().split()
    for name in names:
        if name.endswith(".yaml"):
            (dest / name).write_bytes(_git(["show", f"{ref}:{folder}/{name}"], top))


def load_side(spec: str, workdir: Path, facts_for: FactsFor) -> Side:
    side = Side(spec)
    path, ref = split_spec(spec)
    try:
        if ref is not None:
            found = materialize(path, ref, workdir)
            if found is None:
                side.missing = True
                return side
            path = found
        elif not path.exists():
            side.missing = True
            return side
        recipe = load_recipe(path, local=local_profile).recipe
    except RecipeError as exc:
        side.error = exc.format()
        return side
    except RefError as exc:
        raise RefError(f"{spec}: {exc}") from None
    except ValueError as exc:
        side.error = str(exc)
        return side
    folder = str(path.resolve().parent) + "/"
    side.data = {k: v.replace(folder, "") if isinstance(v, str) else v  # paths relative to the recipe
                 for k, v in flatten(recipe.model_dump(mode="json")).items()}
    side.plan = make_plan(recipe, facts_for(recipe))
    return side


def _change(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "new" if a is None and b is not None else "-"
    if a == b:
        return "="
    return f"{(b - a) / a:+.1%}" if a else "+"


def changed_keys(base: Side, head: Side) -> Section:
    old, new = base.data or {}, head.data or {}
    rows = [[f"`{k}`", human_value(old.get(k)), human_value(new.get(k))]
            for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return Section("Changed keys", ["key", "base", "head"], rows, "" if rows else "No key changed.")


def _range(plan: Plan | None, key: str, fmt: Callable[[float | None], str]) -> tuple[str, float | None]:
    """`P10 – P90` of a total, `seconds` or `usd` (and its P90, for the change column); `-` without ranges."""
    ranges = plan.ranges if plan is not None else None
    band = None if ranges is None else ranges.total if key == "seconds" else ranges.usd["total"]
    return band_text(band, fmt), None if band is None else band.p90


def _value(estimates: Estimates | None, key: str) -> float | None:
    return None if estimates is None else float(getattr(estimates, key))


def plan_totals(base: Side, head: Side) -> Section:
    old = base.plan.totals if base.plan else None
    new = head.plan.totals if head.plan else None
    rows = [[label, fmt(_value(old, key)), fmt(_value(new, key)), _change(_value(old, key), _value(new, key))]
            for label, key, fmt in MEASURES]
    for label, key, fmt in [m for m in MEASURES if m[1] in ("seconds", "usd")]:
        (a, a90), (b, b90) = _range(base.plan, key, fmt), _range(head.plan, key, fmt)
        rows.insert(next(i for i, r in enumerate(rows) if r[0] == label) + 1,
                    [f"{label} P10 – P90", a, b, f"P90 {_change(a90, b90)}"])
    return Section("Plan", ["", "base", "head", "change"], rows,
                   "P10 – P90: the mean output length's uncertainty and each model's error (`dflashx plan --explain`).")


def stage_changes(base: Side, head: Side) -> Section:
    old = {s.name: s for s in base.plan.stages} if base.plan else {}
    rows = []
    for stage in head.plan.stages if head.plan else ():
        before = old.get(stage.name)
        cells = []
        for _, key, fmt in MEASURES:
            a, b = fmt(_value(before.estimates if before else None, key)), fmt(_value(stage.estimates, key))
            cells.append(b if a == b else f"{a} → {b}")
        was = before.enabled if before else True
        if was != stage.enabled or any("→" in c for c in cells):
            enabled = f"{before.enabled if before else '-'} → {stage.enabled}" if was != stage.enabled \
                else str(stage.enabled)
            rows.append([stage.name, enabled, *cells])
    return Section("Stages whose estimates changed", ["stage", "enabled", *(m[0] for m in MEASURES)],
                   rows, "" if rows else "No stage estimate changed.")


def _findings(side: Side, kind: str) -> dict[tuple[str, str], Finding]:
    found = (side.plan.errors if kind == "errors" else side.plan.warnings) if side.plan else []
    return {(f.code, f.key): f for f in found}


def findings_diff(base: Side, head: Side) -> list[str]:
    lines = []
    for kind in ("errors", "warnings"):
        old, new = _findings(base, kind), _findings(head, kind)
        added = [f for k, f in new.items() if k not in old]
        gone = [f for k, f in old.items() if k not in new]
        for title, items in ((f"New {kind}", added), (f"Resolved {kind}", gone)):
            if items:
                lines += [f"### {title}", ""]
                lines += [f"- `{f.code}` at `{f.key}`: {f.message}. Fix: {f.fix}" for f in items]
                lines.append("")
        kept = [f for k, f in new.items() if k in old]
        if kind == "errors" and kept:
            lines += ["### Errors still present", "", *(f"- `{f.code}`: {f.message}" for f in kept), ""]
    return lines


def render(base: Side, head: Side) -> str:
    title = head.spec if not head.missing else base.spec
    out = [f"## Recipe review: `{title}`", "", f"base `{base.spec}` → head `{head.spec}`", ""]
    for side, name in ((base, "base"), (head, "head")):
        if side.error:
            out += [f"**The {name} recipe does not load:**", "", "```", side.error, "```", ""]
    if head.missing:
        return "\n".join(out + ["The head recipe was deleted.", ""])
    if base.missing:
        out += ["New recipe: everything below is compared with nothing.", ""]
    if head.error:
        return "\n".join(out)
    out += [changed_keys(base, head).markdown(), plan_totals(base, head).markdown(),
            stage_changes(base, head).markdown(), *findings_diff(base, head)]
    if head.plan and head.plan.errors:
        out.append(f"**The head plan has {len(head.plan.errors)} error(s): `dflashx run` refuses it.**")
    return "\n".join(out).rstrip() + "\n"


def review(base: str, head: str, facts_for: FactsFor, workdir: Path) -> tuple[str, bool]:
    """(markdown, ok): ok is False when the head recipe does not load or its plan has errors.
    Raises RefError when BASE or HEAD names a git ref that does not resolve."""
    b, h = load_side(base, workdir / "base", facts_for), load_side(head, workdir / "head", facts_for)
    ok = h.error is None and (h.missing or not (h.plan and h.plan.errors))
    return render(b, h), ok
