"""Published speed-up curves of speculative decoding against concurrency, planned as they ran (validation rows of
`benchmarks.planner_accuracy`; nothing is fitted to them).

Each `Curve` is one published measurement of throughput with / without a speculator at several concurrencies
(requests in flight on one server), with the hardware, the engine, the target, the draft method and its accepted
length tau. The plan predicts each point with `deployment.predict_with` (the same function `dflashx plan` and the
eval stage call): one server of the curve's GPU and TP, the workload's prompt and output lengths, the draft
method as a `speculative.Drafter` built from its published architecture (`estimates/drafters.py`; a DFlash
drafter from its config.json), tau as a geometric acceptance profile through the published value. Only curves
that state tau (or give the acceptance data to compute it) are planned: a method's cost is physics, its
acceptance is not.

Every constant the plan uses comes from elsewhere (engine.py, gemm.py, moe.py and their sources); the workloads'
lengths are the sources' where they give them, else stated on the curve.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

REPO = Path(__file__).resolve().parents[1]
SDB = ("arXiv 2601.11580 (SpecDecode-Bench, 'Speculative Decoding: Performance or Illusion?'), Fig. 1, read off the "
       "vector figure specdecode-bench.github.io assets/img/fig1.pdf @fb0e242 (about +-0.01)")
SDB2 = SDB.replace("Fig. 1", "Fig. 2").replace("fig1", "fig2")
SIM = ("SpecDecode-Bench/simulator @2fdccbd data/llama3.1-8B/combined_{}.jsonl: the profiled EAGLE-3 acceptance "
       "(`acc_eagle`, the simulator's eagle3 proposer) walked at 3 draft tokens, tau = generated / steps; the "
       "prompt and generated token counts")
ZLAB = ("z-lab/{} model card (Hugging Face), 'Single NVIDIA B200, SGLang, thinking enabled, max output length 4096, "
        "end-to-end throughput including prefill'; tau averaged over concurrency as the card prints it; the card's "
        "SGLang command: --mem-fraction-static 0.75, --mamba-scheduler-strategy extra_buffer, TP 1")


@dataclass(frozen=True)
class Curve:
    name: str
    source: str
    engine: str  # as published; the plan serves every GPU curve with engine.py's SGLang row (see `planned_as`)
    hardware: str  # hardware profile
    target: str  # registry name
    method: str  # "eagle", "eagle3", "dflash"
    tau: float
    tau_source: str
    prompt: float
    output: float
    published: dict[int, float]  # concurrency -> speed-up
    steps: int = 3  # EAGLE-style chained forwards
    topk: int = 1
    verify: int = 4  # tokens verified per sequence and cycle (a DFlash drafter: its block)
    drafter: dict[str, Any] = field(default_factory=dict)  # a DFlash drafter's recipe keys (its config.json)
    lengths_source: str = ""
    memory: float = 0.85  # the engine's memory fraction as run (vLLM's gpu_memory_utilization default 0.9)

    @property
    def below_one(self) -> list[int]:
        return [c for c, x in self.published.items() if x < 1.0]


def _tau_lengths(dataset: str) -> tuple[float, float, float]:
    """(tau at 3 draft tokens, mean prompt, mean generated) of one SpecDecode-Bench dataset, computed once from the
    simulator's data (`python -m benchmarks.speedup_rows DIR`, DIR holding its combined_*.jsonl, prints them)."""
    return {"gsm8k": (2.394, 94, 165), "cnn": (2.331, 838, 322), "sharegpt": (2.255, 355, 740),
            "instructcoder": (2.352, 171, 250)}[dataset]


def sdb_acceptance(path: Path, drafts: int = 3) -> tuple[float, float, float]:
    """tau, mean prompt and mean generated tokens of one simulator file: each request's profiled EAGLE-3
    acceptance (`acc_eagle.acc_len`: tokens accepted from each position, the bonus included) walked as the
    simulator walks it at `drafts` draft tokens (min(acc_len, drafts + 1) per step from the first generated
    token on), tau = tokens / steps pooled over requests."""
    import json
    import statistics

    tokens = steps = 0
    prompts, outputs = [], []
    for line in path.read_text().splitlines():
        request = json.loads(line)
        accepted = request["acc_eagle"]["acc_len"]
        done = 1
        while done < len(accepted):
            step = min(accepted[done - 1], drafts + 1)
            done, tokens, steps = done + step, tokens + step, steps + 1
        prompts.append(len(request["prompt_token_ids"]))
        outputs.append(len(accepted))
    return tokens / steps, statistics.fmean(prompts), statistics.fmean(outputs)


def _sdb_llama(dataset: str, label: str, published: dict[int, float]) -> Curve:
    tau, prompt, output = _tau_lengths(dataset)
    return Curve(f"Llama-3.1-8B, EAGLE-3 (3 drafts), {label}, vLLM v0.10.1, 1x H100", SDB, "vllm", "h100_x8",
                 "meta-llama/Llama-3.1-8B-Instruct", "eagle3", tau, SIM.format(dataset), prompt, output, published,
                 lengths_source=SIM.format(dataset), memory=0.9)


CURVES: list[Curve] = [
    _sdb_llama("gsm8k", "GSM8K", {1: 1.749, 16: 1.699, 64: 1.486, 128: 1.222}),
    _sdb_llama("cnn", "CNN/DailyMail", {1: 1.686, 16: 1.581, 64: 1.397, 128: 1.235}),
    _sdb_llama("sharegpt", "ShareGPT", {1: 1.712, 16: 1.677, 64: 1.55, 128: 1.296}),
    _sdb_llama("instructcoder", "InstructCoder", {1: 2.02, 16: 1.917, 64: 1.572, 128: 1.309}),
    Curve("Qwen3-8B, EAGLE-3 chain (3 drafts), GSM8K, SGLang v0.5.9, 1x H100", SDB2, "sglang", "h100_x8",
          "Qwen/Qwen3-8B", "eagle3", 2.25, "specdecode-bench.github.io (blog text): accepted length 2.25 -> 2.92 from "
          "chain k=3 to tree k=21 on Qwen3-8B/GSM8K", 94, 165, {1: 1.648, 16: 1.577, 64: 1.311, 128: 1.22},
          lengths_source="GSM8K's lengths from the Llama-3.1-8B data (" + SIM.format("gsm8k") + "): no Qwen3-8B "
          "lengths published"),
    Curve("Qwen3-8B, EAGLE-3 tree (21 drafts, top-4, depth 3), GSM8K, SGLang v0.5.9, 1x H100", SDB2, "sglang",
          "h100_x8", "Qwen/Qwen3-8B", "eagle3", 2.92, "the same blog text (tree k=21)", 94, 165,
          {1: 1.848, 16: 1.336, 64: 0.584, 128: 0.557}, topk=4, verify=22,
          lengths_source="as the chain curve"),
    # Qwen3.5-27B is planned with the registry's Qwen3.6-27B facts: the same config.json text stack (registry ALIASES)
    Curve("Qwen3.5-27B (hybrid), DFlash block 16, Math500, SGLang, 1x B200", ZLAB.format("Qwen3.5-27B-DFlash"),
          "sglang", "b200_nvl8", "Qwen/Qwen3.6-27B", "dflash", 7.93, "the card's tau (Math500, block 16)", 128, 4096,
          {1: 397 / 84, 8: 2270 / 625, 16: 3135 / 1121, 32: 3712 / 1949}, verify=16,
          drafter={"num_layers": 5, "block_size": 16}, memory=0.75,
          lengths_source="prompt ~128 tokens (a Math500 question in the chat template: assumed) and the output cap "
                         "4,096 (thinking on: stated assumption that most replies reach it)"),
    Curve("Qwen3.5-27B (hybrid), DFlash block 16, MT-Bench, SGLang, 1x B200", ZLAB.format("Qwen3.5-27B-DFlash"),
          "sglang", "b200_nvl8", "Qwen/Qwen3.6-27B", "dflash", 5.47, "the card's tau (MT-Bench, block 16)", 128,
          4096, {1: 255 / 84, 8: 1444 / 622, 16: 1984 / 1113, 32: 2391 / 1900}, verify=16,
          drafter={"num_layers": 5, "block_size": 16}, memory=0.75, lengths_source="as the Math500 curve"),
    Curve("Qwen3.6-35B-A3B (MoE), DFlash block 16, Math500, SGLang, 1x B200", ZLAB.format("Qwen3.6-35B-A3B-DFlash"),
          "sglang", "b200_nvl8", "Qwen/Qwen3.6-35B-A3B", "dflash", 7.35, "the card's tau (Math500, block 16)", 128,
          4096, {1: 682 / 234, 8: 3138 / 1266, 16: 4813 / 1954, 32: 6520 / 2755}, verify=16,
          drafter={"num_layers": 5, "block_size": 16, "intermediate_size": 6144}, memory=0.75,
          lengths_source="as the 27B curves"),
    Curve("Qwen3.6-35B-A3B (MoE), DFlash block 16, MT-Bench, SGLang, 1x B200", ZLAB.format("Qwen3.6-35B-A3B-DFlash"),
          "sglang", "b200_nvl8", "Qwen/Qwen3.6-35B-A3B", "dflash", 5.14, "the card's tau (MT-Bench, block 16)", 128,
          4096, {1: 442 / 233, 8: 2028 / 1238, 16: 2997 / 1885, 32: 4034 / 2633}, verify=16,
          drafter={"num_layers": 5, "block_size": 16, "intermediate_size": 6144}, memory=0.75,
          lengths_source="as the 27B curves"),
]


def _profile(name: str) -> dict[str, Any]:
    return yaml.safe_load((REPO / "dflashx" / "hardware_profiles" / f"{name}.yaml").read_text())


def curve_recipe(curve: Curve) -> Any:
    """The seeds' recipe moved to the curve's conditions: target, GPU (TP 1), workload, a DFlash drafter's keys."""
    from dflashx.config.schema import Recipe
    from dflashx.resolve import resolve
    from dflashx.targets.registry import lookup

    data = yaml.safe_load((REPO / "recipes" / "qwen36_27b.yaml").read_text())
    data["hardware"] = _profile(curve.hardware)
    data["target"].update(model=curve.target, mtp=False)
    data["drafter"] = {"architecture": "dflash", **curve.drafter}
    data["dataset"]["stats"] = {"prompt_tokens_mean": curve.prompt, "output_tokens_mean": curve.output,
                                "output_tokens_p90": curve.output + 0.5}
    data["stages"]["generate"].update(max_tokens=int(curve.output) + 1, hierarchical_cache=False,
                                      serving={"tp": 1, "max_running_requests": 4096,
                                               "mem_fraction_static": curve.memory})
    recipe = Recipe.model_validate(data)
    return resolve(recipe, lookup(curve.target))


def curve_drafter(curve: Curve, resolved: Any) -> Any:
    """The curve's draft method as the serving model prices it."""
    from dflashx.plan.estimates.drafters import eagle_drafter
    from dflashx.plan.estimates.speculative import dflash_drafter

    if curve.method == "dflash":
        return dflash_drafter(resolved, resolved.drafter.dims, curve.verify, None, curve.tau)
    return eagle_drafter(resolved.target.facts, curve.method == "eagle3", curve.steps, curve.topk, curve.verify,
                         curve.tau)


def predict(curve: Curve) -> Any:
    """The plan's `Deployment` for the curve's conditions at its published concurrencies."""
    from dflashx.plan.estimates.deployment import predict_with
    from dflashx.resolve.speculative import geometric_profile

    resolved = curve_recipe(curve)
    drafter = curve_drafter(curve, resolved)
    acceptance = geometric_profile(curve.tau, drafter.drafts)
    return predict_with(resolved, drafter, acceptance, drafter.verify_tokens, sorted(curve.published),
                        f"published tau {curve.tau}")


def crossover(points: dict[int, float]) -> int | None:
    """The first concurrency of the grid at which the speed-up is below 1 (None: none)."""
    return next((c for c in sorted(points) if points[c] < 1.0), None)


def within_one_step(grid: list[int], published: int | None, predicted: int | None) -> bool:
    """The acceptance test: the two crossovers are the same grid point or neighbours, or both outside the grid."""
    if published is None or predicted is None:
        return published is None and predicted is None
    return abs(grid.index(published) - grid.index(predicted)) <= 1


def rows(make_row: Callable[..., Any]) -> tuple[list[Any], list[dict[str, Any]]]:
    """(validation rows, one crossover check per curve) for `benchmarks.planner_accuracy`."""
    out, checks = [], []
    for curve in CURVES:
        deployment = predict(curve)
        predicted = {r.concurrency: r.speedup for r in deployment.rows}
        for c, measured in sorted(curve.published.items()):
            out.append(make_row(f"{curve.name}, conc {c}", f"tau {curve.tau} ({curve.tau_source}); prompt "
                                f"{curve.prompt:.0f} / output {curve.output:.0f} tokens ({curve.lengths_source})",
                                curve.source, "validation", "x (speed-up)", measured, predicted[c]))
        grid = sorted(curve.published)
        pub, pred = crossover(curve.published), crossover(predicted)
        checks.append({"curve": curve.name, "grid": grid, "published_crossover": pub, "predicted_crossover": pred,
                       "switch_off_above": deployment.switch_off_above,
                       "within_one_step": within_one_step(grid, pub, pred)})
    return out, checks


# Engine speed-ups measured on this project's own machines (a row kind of their own, "engine speed-up, measured
# here"): benchmarks/results/engine_speedup.json, {"measurements": [{"name", "source", "recipe" (a recipe file),
# "overrides" (dotted keys, as `dflashx plan` takes them), "concurrency", "acceptance_by_position" (measured), "tau",
# "speedup" (measured tokens/s with the drafter / without)}]}. Each is predicted by `deployment.predict_speedup` on
# the recipe's own drafter at the measured acceptance. Its one row: vLLM's CPU build serving the tiny target with
# the tiny run's DFlash export at c=1, 3.43x measured (issue 37), 2.72x predicted (-21%).
ENGINE_SPEEDUP = REPO / "benchmarks" / "results" / "engine_speedup.json"


def measured_here_rows(make_row: Callable[..., Any]) -> list[Any]:
    """The "engine speed-up, measured here" rows (none until ENGINE_SPEEDUP exists)."""
    import json

    from dflashx.config.load import load_recipe
    from dflashx.plan.estimates.deployment import predict_speedup
    from dflashx.resolve import resolve
    from dflashx.targets.facts import facts_for

    if not ENGINE_SPEEDUP.is_file():
        return []
    out = []
    for m in json.loads(ENGINE_SPEEDUP.read_text())["measurements"]:
        recipe = load_recipe(REPO / m["recipe"], tuple(m.get("overrides", ()))).recipe
        facts = facts_for(recipe.target)
        assert facts is not None, f"{m['recipe']}: unknown target"
        resolved = resolve(recipe, facts)
        predicted = predict_speedup(resolved, m["acceptance_by_position"], resolved.drafter.dims,
                                    concurrencies=[m["concurrency"]]).rows[0].speedup
        out.append(make_row(f"engine speed-up, measured here: {m['name']}", f"conc {m['concurrency']}, tau "
                            f"{m['tau']:.2f}, {m['recipe']} {' '.join(m.get('overrides', ()))}", m["source"],
                            "validation", "x (speed-up)", m["speedup"], predicted))
    return out


if __name__ == "__main__":
    import sys

    for name in ("gsm8k", "cnn", "sharegpt", "instructcoder"):
        tau, prompt, output = sdb_acceptance(Path(sys.argv[1]) / f"combined_{name}.jsonl")
        print(f"{name}: tau {tau:.3f}, prompt {prompt:.0f}, generated {output:.0f}")
