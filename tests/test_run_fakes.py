"""Small fake stages and a test recipe for the orchestrator tests (testing the orchestrator, not the
stages: the real stage bodies are tested in their own files). Imported by tests/test_run_*.py and
by the SIGKILL subprocess of test_run_resume.py."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from dflashx.config.schema import Recipe
from dflashx.plan.context import Estimates, totals
from dflashx.plan.plan import Plan, StagePlan
from dflashx.report.lines import EchoObserver
from dflashx.report.progress import write_progress
from dflashx.resolve import ResolvedRecipe, resolve
from dflashx.run.graph import select
from dflashx.run.orchestrator import RunResult, describe_run, run_pipeline
from dflashx.stages.base import Artifact, StageContext, StageFailed, StageResult
from dflashx.targets.registry import lookup

REPO = Path(__file__).resolve().parents[1]
CALLS: Counter[str] = Counter()
CPU = {"name": "cpu", "gpu": None, "gpus_per_node": 0, "usd_per_gpu_hour": 0.0, "cpu_tflops": 0.1}
OTHER_HW = {"name": "h200_x8", "gpus_per_node": 8, "usd_per_gpu_hour": 3.5,
            "gpu": {"name": "H200", "memory_gb": 141, "bandwidth_tbs": 4.8, "bf16_tflops": 989}}


def write_prompts(path: Path, n: int = 6) -> Path:
    path.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                            for i in range(n)))
    return path


def recipe_data(source: Path, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "fake",
        "dataset": {"sources": [{"name": "local", "path": str(source)}], "eval_holdout": 2},
        "target": {"model": "builtin:tiny-qwen3", "precision": "fp32"},
        "drafter": {"num_layers": 1, "block_size": 8, "num_target_layers": 2},
        "hardware": CPU,
        "stages": {"train": {"lr": 3e-3}, "backup": {"enabled": False}},
        "tracking": {"mode": "disabled"},
    }
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return data


def write_recipe(path: Path, source: Path, **changes: Any) -> Path:
    """The fake recipe as a YAML file with the hardware named as a profile, for tests that go through
    the CLI's loader; `changes` are dotted keys as in `recipe_data`."""
    stats = {"samples": 4, "prompt_tokens_mean": 20, "output_tokens_mean": 10, "output_tokens_p90": 12}
    data = recipe_data(source, **{"hardware": "cpu", "dataset.stats": stats,
                                  "stages.generate": {"backend": "transformers", "max_tokens": 16}} | changes)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def make_recipe(source: Path, **changes: Any) -> Recipe:
    return Recipe.model_validate(recipe_data(source, **changes))


def resolved(recipe: Recipe) -> ResolvedRecipe:
    """The test recipe resolved on its builtin target's registered facts."""
    return recipe if isinstance(recipe, ResolvedRecipe) else resolve(recipe, lookup("builtin:tiny-qwen3"))


def make_plan(recipe: Recipe) -> Plan:
    """A plan of the planner's type with fixed estimates (the planner itself is tested elsewhere)."""
    estimates = Estimates(seconds=1.0, usd=0.25, storage_bytes=100)
    stages = tuple(StagePlan(n, getattr(recipe.stages, n).enabled, estimates=estimates)
                   for n in type(recipe.stages).model_fields)
    return Plan((), stages, totals([s.estimates for s in stages]), resolved(recipe))


def _lines(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted(folder.glob("*.jsonl")) for line in f.read_text().splitlines() if line]


def ingest(ctx: StageContext) -> StageResult:
    CALLS["ingest"] += 1
    rows = [json.loads(line) for line in Path(ctx.recipe.dataset.sources[0].path).read_text().splitlines()]
    hold = ctx.recipe.dataset.eval_holdout
    (ctx.out_dir / "prompts").mkdir(exist_ok=True)
    (ctx.out_dir / "prompts" / "shard-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[hold:]))
    (ctx.out_dir / "eval_prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:hold]))
    ctx.log({"prompts": len(rows) - hold})
    return StageResult({"prompts": Artifact("prompts", "irreplaceable"),
                        "eval_prompts": Artifact("eval_prompts.jsonl")},
                       {"prompts": len(rows) - hold})


def generate(ctx: StageContext) -> StageResult:
    """Appends one fsync'ed line per prompt and skips ids already written (resume)."""
    CALLS["generate"] += 1
    out = ctx.out_dir / "completions"
    out.mkdir(exist_ok=True)
    done = {r["id"] for r in _lines(out)}
    delay = float(os.environ.get("FAKE_GENERATE_DELAY", "0"))
    with open(out / "part-0.jsonl", "a") as f:
        for i, prompt in enumerate(_lines(ctx.inputs["ingest.prompts"])):
            if prompt["id"] in done:
                continue
            answer = f"a-{prompt['id']}-t{ctx.config.temperature}"
            f.write(json.dumps({**prompt, "answer": answer}) + "\n")
            f.flush()
            os.fsync(f.fileno())
            ctx.log({"written": i + 1}, step=i)
            time.sleep(delay)
    return StageResult({"completions": Artifact("completions")}, {"resumed_from": len(done)})


def qc(ctx: StageContext) -> StageResult:
    CALLS["qc"] += 1
    n = len(_lines(ctx.inputs["generate.completions"]))
    if ctx.config.thresholds.max_truncated_frac == 0:
        raise StageFailed("QC failed: 1 check over its threshold (truncated 0.10 > 0.00)", {"truncated_frac": 0.1})
    (ctx.out_dir / "report").mkdir(exist_ok=True)
    (ctx.out_dir / "report" / "qc.json").write_text(json.dumps({"samples": n}))
    return StageResult({"report": Artifact("report")}, {"samples": n, "passed": True})


def tokenize(ctx: StageContext) -> StageResult:
    CALLS["tokenize"] += 1
    rows = _lines(ctx.inputs["generate.completions"])
    (ctx.out_dir / "dataset").mkdir(exist_ok=True)
    (ctx.out_dir / "dataset" / "data.jsonl").write_text(
        "".join(json.dumps({"ids": [len(r["answer"])]}) + "\n" for r in rows))
    return StageResult({"dataset": Artifact("dataset")}, {"samples": len(rows)})


def train(ctx: StageContext) -> StageResult:
    CALLS["train"] += 1
    if os.environ.get("FAKE_TRAIN_CRASH"):
        raise ZeroDivisionError("loss scale underflow")
    n = len(_lines(ctx.inputs["tokenize.dataset"]))
    for step in range(3):
        ctx.log({"loss": 1.0 / (step + 1), "lr": ctx.config.lr}, step=step)
    (ctx.out_dir / "checkpoint").mkdir(exist_ok=True)
    (ctx.out_dir / "checkpoint" / "model.json").write_text(json.dumps({"lr": ctx.config.lr, "samples": n}))
    (ctx.out_dir / "train.log").write_text("step 0..2\n")
    return StageResult({"checkpoint": Artifact("checkpoint", "irreplaceable"), "logs": Artifact("train.log")},
                       {"final_loss": 1 / 3})


def evaluate(ctx: StageContext) -> StageResult:
    CALLS["eval"] += 1
    ckpt = json.loads((ctx.inputs["train.checkpoint"] / "model.json").read_text())
    (ctx.out_dir / "report").mkdir(exist_ok=True)
    (ctx.out_dir / "report" / "eval.json").write_text(json.dumps({"tau": 2.5, "lr": ckpt["lr"]}))
    return StageResult({"report": Artifact("report")},
                       {"tau": 2.5, "eval_prompts": "ingest.eval_prompts" in ctx.inputs})


def export(ctx: StageContext) -> StageResult:
    CALLS["export"] += 1
    (ctx.out_dir / "drafter").mkdir(exist_ok=True)
    (ctx.out_dir / "drafter" / "config.json").write_text((ctx.inputs["train.checkpoint"] / "model.json").read_text())
    return StageResult({"drafter": Artifact("drafter", "irreplaceable")})


def backup(ctx: StageContext) -> StageResult:
    CALLS["backup"] += 1
    (ctx.out_dir / "backup.json").write_text(json.dumps({"ok": True}))
    return StageResult({"receipt": Artifact("backup.json", "irreplaceable")})


FAKES: dict[str, Callable[[StageContext], StageResult]] = {
    "ingest": ingest, "generate": generate, "qc": qc, "tokenize": tokenize, "train": train,
    "eval": evaluate, "export": export, "backup": backup,
}


def fake_load_stage(name: str) -> Callable[[StageContext], StageResult]:
    return FAKES[name]


def load_without(missing: str) -> Callable[[str], Callable[[StageContext], StageResult]]:
    """A stage loader whose `missing` stage module does not exist yet (as before its issue lands)."""
    def load(name: str) -> Callable[[StageContext], StageResult]:
        if name == missing:
            module = f"dflashx.stages.{name}"
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)
        return FAKES[name]

    return load


def run(recipe: Recipe, run_dir: Path, lines: list[str] | None = None, **select_args: Any) -> RunResult:
    """The stages as `dflashx run` runs them: the folder described by the plan (`describe_run`), then the pipeline."""
    observer = EchoObserver(lines.append) if lines is not None else None
    plan = make_plan(recipe)
    describe_run(run_dir, plan)
    return run_pipeline(resolved(recipe), plan, run_dir, select(**select_args),
                        argv=["dflashx", "run", "fake.yaml"], on_progress=write_progress, observer=observer)
