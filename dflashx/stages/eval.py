"""The eval stage: real speculative decoding of prompt suites with the trained drafter and baselines.

Reads `train.checkpoint` and, for the `heldout` suite, the held-out prompts (`stages.eval.prompts`
when set, else `ingest.eval_prompts`). Every suite of `stages.eval.suites` (resolved:
`dflashx.resolve.suites`; read: `dflashx.data.suites`) is decoded with the target and each drafter
(`dflashx.stages.eval_drafters`: the trained one, then `stages.eval.baselines`, e.g. `untrained`
or a published drafter's folder) greedily and, when the drafter will be served sampled
(`deploy.temperature` > 0), `sampled_runs` more times at the serving settings (temperature, top_p,
top_k; rejection sampling, the N runs decoded as one batch from one generator seeded 0),
`dflashx.dflash.spec_decode`. Writes `report`:
eval.json, acceptance.png and speedup.png (the predicted serving speed-up, at the served tau).

eval.json: `suites: {suite: {drafter: summary}}` (greedy: tau, accepted_plus_one, acceptance per
draft position, accepted-length histogram, tokens/s, cycles, prompts, per prompt tau, and the same per
prompt `source` and per prompt-length bucket; when sampled, `sampled`: tau per seed, their mean, its
standard error and 95% interval, acceptance pooled over the seeds), `decode_batches` (per batch: drafter,
sampled or not, rows, draft-verify cycles, seconds), `sampling` (the serving settings
and seeds, null when greedy), `suite_prompts: {suite: {prompts, prompt_ids,
prompt_sources, prompt_tokens, greedy_agreement}}`, `drafters: {drafter: {kind, path, layout,
block_size, target_layer_ids}}`; and, as before suites existed, the first suite's figures at the
top level (`trained`, `untrained`, `prompts`, `prompt_ids`, ...). Greedily every drafter must
produce the target's own greedy output, so `greedy_agreement` (share of prompts whose outputs agree
across all drafters) should be 1.0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dflashx.config.eval_suites import TRAINED, UNTRAINED
from dflashx.data import chat_contract
from dflashx.data.chat_mask import render_prompt
from dflashx.data.suites import suite_prompts
from dflashx.stages import eval_engine, eval_speedup
from dflashx.stages.base import Artifact, EvalContext, StageFailed, StageResult
from dflashx.stages.eval_drafters import CHECKPOINT, EvalDrafter, eval_drafters, load
from dflashx.stages.graph import GRAPH
from dflashx.store.atomic import atomic_write_json
from dflashx.targets.load import stop_ids
from dflashx.dflash.acceptance import UNKNOWN_SOURCE, context_bucket, drafter_summary, plot_acceptance, sampled_summary
from dflashx.targets.load import load_model, load_tokenizer

PROMPTS = GRAPH["eval"].optional_inputs[0]


def _heldout_file(ctx: EvalContext) -> Path | None:
    if ctx.config.prompts:
        return Path(ctx.config.prompts)
    return ctx.inputs.get(PROMPTS)


def _load_target(ctx: EvalContext):
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    precision = ctx.recipe.target.load_precision
    target = load_model(ctx.recipe.target, precision)
    if precision == "fp8":  # as served: every decoder layer's linears in FP8
        from dflashx.dflash.fp8 import target_to_fp8

        target_to_fp8(target, torch.device(device))
    target = target.to(device).eval().requires_grad_(False)
    return target, load_tokenizer(ctx.recipe.target)


def _release() -> None:
    """Give the memory of the dropped target back (a server starts next)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def prompt_source(prompt: dict[str, Any]) -> str:
    """The source a prompt record names (ingest writes it), "unknown" when it names none."""
    return str(prompt.get("source") or UNKNOWN_SOURCE)


def _suite_inputs(ctx: EvalContext, tokenizer: Any) -> dict[str, dict[str, Any]]:
    """Per suite: its prompts' ids, sources, token ids and context buckets (read and encoded once)."""
    chat, heldout = ctx.recipe.target.chat_template, _heldout_file(ctx)
    out = {}
    for suite in ctx.config.suites:
        prompts = suite_prompts(suite, heldout)
        encoded = [tokenizer(render_prompt(tokenizer, p, chat), add_special_tokens=False)["input_ids"]
                   for p in prompts]
        out[suite.name] = {"ids": [p.get("id") for p in prompts], "sources": [prompt_source(p) for p in prompts],
                           "encoded": encoded, "buckets": [context_bucket(len(e)) for e in encoded]}
    return out


def _served(ctx: EvalContext) -> dict[str, Any]:
    """The serving settings (`deploy`) as `SpecDecoder.generate` takes them."""
    deploy = ctx.recipe.deploy
    return {"temperature": deploy.temperature, "top_p": deploy.top_p, "top_k": deploy.top_k}


def _sampling(ctx: EvalContext) -> dict[str, Any] | None:
    """eval.json's `sampling`: the serving settings the sampled runs decode at and their seeds, None when greedy."""
    return (_served(ctx) | {"seeds": ctx.config.sampled_runs}) if ctx.config.sampled_runs else None


Decoded = dict[str, dict[str, list[list[Any]]]]  # {suite: {drafter: [[DecodeResult per prompt] per run]}}


def _decode(ctx: EvalContext, target: Any, drafters: list[EvalDrafter], suites: dict[str, dict[str, Any]],
            stops: list[int]) -> tuple[Decoded, list[dict[str, Any]]]:
    """Per drafter, every suite's prompts greedily as one batch (`BatchDecoder`: in chunks where the GPU's memory
    asks for them; one prompt at a time for a hybrid target) and, for the trained drafter, the `sampled_runs` runs
    at the serving settings as one more batch of runs x prompts rows drawn from one generator seeded 0 (the
    baselines are compared greedily); one drafter in memory at a time. On a GPU a batch's decode costs about the
    same per cycle whatever its rows (launch-bound), so one batch per drafter and setting, not per suite and run.
    Also each batch's drafter, setting, rows, draft-verify cycles and seconds (eval.json `decode_batches`: what the
    planner's price of a GPU eval counts)."""
    import torch

    from dflashx.dflash.batch_decode import BatchDecoder

    cfg, device = ctx.config, next(target.parameters()).device
    prompts = [(name, p) for name, suite in suites.items() for p in suite["encoded"]]
    total, done = len(prompts) * (len(drafters) + cfg.sampled_runs), 0
    results: Decoded = {name: {} for name in suites}
    timed: list[dict[str, Any]] = []
    for drafter in drafters:
        decoder = BatchDecoder(target, load(drafter, device))
        runs = 1 + (cfg.sampled_runs if drafter.name == TRAINED else 0)
        for name in suites:
            results[name][drafter.name] = [[] for _ in range(runs)]
        # (the first run a batch holds, its setting, its runs): the greedy run 0, then runs 1.. sampled
        batches = [(0, {"temperature": 0.0}, 1)] + ([(1, _served(ctx), runs - 1)] if runs > 1 else [])
        for first, setting, copies in batches:
            rows = [p for _ in range(copies) for _, p in prompts]
            gen = torch.Generator(device=decoder.device).manual_seed(0)
            decoded = decoder.generate(rows, cfg.max_new_tokens, stop_token_ids=stops, generator=gen, **setting)
            timed.append({"drafter": drafter.name, "sampled": bool(first), "rows": len(rows),
                          "cycles": decoder.cycles, "seconds": sum(r.seconds for r in decoded)})  # the batch's wall
            live = f"eval/{drafter.name}_tau" + ("_sampled" if first else "")  # the greedy figure stays apart
            for i, result in enumerate(decoded):
                run, (name, _) = first + i // len(prompts), prompts[i % len(prompts)]
                results[name][drafter.name][run].append(result)
                done += 1
                ctx.log({live: result.tau, "eval/decoded": done, "eval/decodes": total})
        del decoder
    return results, timed


def _agreeing(runs: dict[str, list[Any]]) -> list[bool]:
    """Per prompt: whether every drafter's output is the same."""
    return [len({tuple(r.output_ids) for r in row}) == 1 for row in zip(*runs.values())]


def _summary(runs: list[list[Any]], block_size: int, suite: dict[str, Any]) -> dict[str, Any]:
    """One drafter's entry on one suite: the greedy run's figures and, when sampled, `sampled`."""
    greedy, *sampled = runs
    summary = drafter_summary(greedy, block_size, suite["sources"], suite["buckets"])
    return (summary | {"sampled": sampled_summary(sampled, block_size)}) if sampled else summary


def evaluate(ctx: EvalContext, target: Any, drafters: list[EvalDrafter], suites: dict[str, dict[str, Any]],
             stops: list[int]) -> tuple[dict[str, Any], Decoded]:
    """Decode every suite with every drafter: the eval.json content (see the module docstring) and the decodes."""
    results, batches = _decode(ctx, target, drafters, suites, stops)
    agree = {suite: _agreeing({d: runs[0] for d, runs in by_drafter.items()}) for suite, by_drafter in results.items()}
    blocks = {d.name: d.config.block_size for d in drafters}
    table = {suite: {name: _summary(runs, blocks[name], suites[suite]) for name, runs in by_drafter.items()}
             for suite, by_drafter in results.items()}
    info = {suite: {"prompts": len(s["encoded"]), "prompt_ids": s["ids"], "prompt_sources": s["sources"],
                    "prompt_tokens": [len(e) for e in s["encoded"]],
                    "greedy_agreement": sum(agree[suite]) / len(agree[suite])}
            for suite, s in suites.items()}
    first, every = next(iter(table)), [a for flags in agree.values() for a in flags]
    return {
        "block_size": blocks[TRAINED],
        "sampling": _sampling(ctx),
        "max_new_tokens": ctx.config.max_new_tokens,
        "drafters": {d.name: d.describe() for d in drafters},
        "suites": table,
        "suite_prompts": info,
        # the first suite's figures where they were before suites existed
        **{k: v for k, v in info[first].items() if k != "greedy_agreement"},
        **{name: table[first][name] for name in (TRAINED, UNTRAINED) if name in table[first]},
        "greedy_agreement": sum(every) / len(every),  # over every suite's prompts
        "decode_batches": batches,
    }, results


def sampled_text(sampled: dict[str, Any], sampling: dict[str, Any]) -> str:
    """`τ 3.71 ± 0.08 at temperature 0.6 (95% interval, 5 seeds)`: the served tau of the run summary."""
    low, high = sampled["tau_ci95"]
    return (f"τ {sampled['tau']:.2f} ± {(high - low) / 2:.2f} at temperature {sampling['temperature']:g} "
            f"(95% interval, {sampled['seeds']} seeds)")


def metrics_of(result: dict[str, Any]) -> dict[str, Any]:
    """The stage record's figures: the trained drafter's on the first suite, and tau per suite and drafter
    (greedy; and at the serving temperature when sampled)."""
    t, u = result[TRAINED], result.get(UNTRAINED)
    metrics = {
        "tau": t["tau"],
        "acceptance_by_position": t["acceptance_by_position"],
        "tokens_per_s": t["tokens_per_s"],
        "tau_by_source": {k: v["tau"] for k, v in t["by_source"].items()},
        "tau_by_context": {k: v["tau"] for k, v in t["by_context"].items()},
        "tau_by_suite": {suite: {d: s["tau"] for d, s in by_drafter.items()}
                         for suite, by_drafter in result["suites"].items()},
        "greedy_agreement": result["greedy_agreement"],
    }
    if u is not None:
        metrics |= {"tau_untrained": u["tau"], "tokens_per_s_untrained": u["tokens_per_s"]}
    if "sampled" in t:
        metrics |= {"tau_sampled": t["sampled"]["tau"], "tau_sampled_se": t["sampled"]["tau_se"],
                    "tau_sampled_text": sampled_text(t["sampled"], result["sampling"]),
                    "tau_sampled_by_suite": {suite: by_drafter[TRAINED]["sampled"]["tau"]
                                             for suite, by_drafter in result["suites"].items()}}
    return metrics


def run(ctx: EvalContext) -> StageResult:
    report = ctx.out_dir / "report"
    report.mkdir(parents=True, exist_ok=True)
    drafters = eval_drafters(ctx)  # every drafter checked against the target before anything is loaded
    target, tokenizer = _load_target(ctx)
    chat = ctx.recipe.target.chat_template
    contract = chat_contract.ChatContract.for_tokenizer(tokenizer, chat.enable_thinking, chat.kwargs)
    try:  # evaluate with the template and thinking mode the drafter was trained for
        chat_contract.check(contract, ctx.inputs[CHECKPOINT], CHECKPOINT)
    except chat_contract.ContractMismatch as e:
        raise StageFailed(str(e)) from None
    suites, stops = _suite_inputs(ctx, tokenizer), stop_ids(ctx.recipe.target, tokenizer)
    result, decoded = evaluate(ctx, target, drafters, suites, stops)
    result |= {"chat_contract": contract.to_json()}
    result |= eval_speedup.section(ctx.recipe, result, report)  # tokens/s with the drafter where it is served
    if ctx.config.engine:  # the trained drafter through a real server, beside our decoder (eval_engine)
        del target  # the server needs the accelerator's memory
        _release()
        first = next(iter(suites))
        result |= eval_engine.section(ctx.recipe, eval_engine.folder(ctx, ctx.out_dir / "engine"),
                                      suites[first]["encoded"], [r.output_ids for r in decoded[first][TRAINED][0]],
                                      stops, result.get(eval_speedup.KEY), ctx.out_dir / "engine")
    atomic_write_json(report / "eval.json", result)
    first = next(iter(result["suites"]))
    plot_acceptance(result["suites"][first], report / "acceptance.png", suites=result["suites"], suite=first)
    return StageResult(
        artifacts={"report": Artifact("report", tier="replaceable", description="eval.json + acceptance.png")},
        metrics=metrics_of(result) | eval_speedup.metrics(result) | eval_engine.metrics(result),
    )
